package main

import (
	"fmt"
	"io"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
)

// globalOptions are the flags every subcommand shares.
type globalOptions struct {
	logLevel  string
	logFormat string
	json      bool
	details   bool
	log       *logrus.Logger
}

// newRootCmd is qpdrain's command tree, writing to stdout and stderr.
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root, _ := newRoot(stdout, stderr)
	return root
}

// newRoot is newRootCmd with the global options its flags fill.
func newRoot(stdout, stderr io.Writer) (*cobra.Command, *globalOptions) {
	opts := &globalOptions{}
	root := &cobra.Command{
		Use:   "qpdrain",
		Short: "Tear down RDMA queue pairs correctly and find the ones never torn down",
		Long: "qpdrain tears down RDMA queue pairs correctly and finds the ones never torn down.\n" +
			"Every command checks its flags before it does anything, and exits 0 clean, 1 with findings,\n" +
			"2 on an error or bad input, 3 when the device (or RDMA) is not here, 130 when interrupted\n" +
			"(SIGINT, SIGTERM). An error is one line on stderr; with -j it is also the JSON document\n" +
			"{\"error\": ..., \"exit_code\": ...} on stdout.",
		Version:       versionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(stderr, opts.logLevel, opts.logFormat)
			if err != nil {
				return withExitCode(exitError, err)
			}
			opts.log = log
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&opts.logLevel, "log-level", "warning", "log level: trace, debug, info, warning, error")
	pf.StringVar(&opts.logFormat, "log-format", "text", "log format: text or json")
	pf.BoolVarP(&opts.json, "json", "j", false, "print JSON")
	pf.BoolVarP(&opts.details, "details", "d", false, "print details")
	for _, add := range subcommands {
		root.AddCommand(add(opts))
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.InitDefaultCompletionCmd()
	requireSubcommand(root)
	return root, opts
}

// subcommands holds the constructors of qpdrain's subcommands; each file
// registers its own in init, so subcommands stay independent.
var subcommands []func(*globalOptions) *cobra.Command

func newLogger(w io.Writer, level, format string) (*logrus.Logger, error) {
	log := logrus.New()
	log.SetOutput(w)
	lvl, err := logrus.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level %q: want trace, debug, info, warning or error", level)
	}
	log.SetLevel(lvl)
	switch format {
	case "text":
		log.SetFormatter(&logrus.TextFormatter{})
	case "json":
		log.SetFormatter(&logrus.JSONFormatter{})
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
	return log, nil
}
