package main

import "github.com/qpdrain/qpdrain/ibv"

// noLibibverbs says why the libibverbs implementation cannot be used here
// ("libibverbs is not installed: ... (install ...)"), for the first line of
// the commands that run on the soft device instead; "" when it can.
func noLibibverbs() string {
	if err := ibv.Load(); err != nil {
		return err.Error()
	}
	return ""
}
