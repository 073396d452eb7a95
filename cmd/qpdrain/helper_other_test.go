//go:build !linux

package main

// runHelper: the helper processes hold QPs of the kernel's rxe and read
// /proc (helper_linux_test.go), so there are none to run off Linux.
func runHelper() {}
