package main

import (
	"encoding/json"
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newVersionCmd) }

// buildVersion is what the Go toolchain recorded in the binary
// (runtime/debug.ReadBuildInfo): the module's version ("(devel)" for a
// build from a checkout), the VCS revision and time, and the Go version.
type buildVersion struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Revision string `json:"vcs_revision,omitempty"`
	Time     string `json:"vcs_time,omitempty"`
	Modified bool   `json:"vcs_modified,omitempty"`
	Go       string `json:"go"`
}

func readBuildVersion() buildVersion {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return buildVersion{Version: "unknown (no build information in the binary)"}
	}
	v := buildVersion{Module: bi.Main.Path, Version: bi.Main.Version, Go: bi.GoVersion}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (v buildVersion) String() string {
	s := fmt.Sprintf("qpdrain %s", v.Version)
	if v.Module != "" {
		s = fmt.Sprintf("qpdrain %s %s", v.Module, v.Version)
	}
	if v.Revision != "" {
		s += " revision " + v.Revision
		if v.Modified {
			s += " (modified)"
		}
	} else {
		s += " (no VCS revision in the build info: built with -buildvcs=false, outside a git checkout, or in a git worktree)"
	}
	if v.Time != "" {
		s += " " + v.Time
	}
	if v.Go != "" {
		s += " " + v.Go
	}
	return s
}

// versionString is the --version line.
func versionString() string { return readBuildVersion().String() }

func newVersionCmd(opts *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print qpdrain's version: module version, VCS revision and time, Go version (from the build info)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := readBuildVersion()
			if opts.json {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(v)
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), v)
			return err
		},
	}
}
