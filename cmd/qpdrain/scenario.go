package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/scenario"
)

func init() { subcommands = append(subcommands, newScenarioCmd) }

func newScenarioCmd(opts *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "scenario [NAME]",
		Short: "Run a scripted scenario on soft devices and print its trace, step by step",
		Long: "Run a scripted scenario on in-process soft RDMA devices and print, for each step, one line\n" +
			"saying what it shows, then what the devices did: state changes, completions, async events.\n" +
			"Without a name it lists the scenarios. Scenarios: " + strings.Join(scenario.Names, ", ") + ".",
		Args:      cobra.MaximumNArgs(1),
		ValidArgs: scenario.Names,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return listScenarios(cmd.OutOrStdout(), opts.json)
			}
			steps, err := scenario.Run(args[0])
			if err != nil {
				return withExitCode(exitError, fmt.Errorf("scenario %s: %w", args[0], err))
			}
			opts.log.WithField("scenario", args[0]).WithField("steps", len(steps)).Debug("scenario ran")
			if opts.json {
				return printJSON(cmd.OutOrStdout(), steps)
			}
			return scenario.Format(cmd.OutOrStdout(), steps)
		},
	}
}

// listScenarios prints the scenarios' names, one a line, or as a JSON list.
func listScenarios(w io.Writer, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(scenario.Names)
	}
	_, err := fmt.Fprintln(w, strings.Join(scenario.Names, "\n"))
	return err
}
