package main

import (
	"errors"
	"io"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
)

// globalOptions are the flags every subcommand shares.
type globalOptions struct {
	logLevel  logrus.Level
	logFormat string // text or json
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
			opts.log = newLogger(stderr, opts.logLevel, opts.logFormat)
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	wordFlag(pf, &opts.logLevel, "log-level", logrus.WarnLevel, "log level: trace, debug, info, warning, error", parseLogLevel)
	stringFlag(pf, &opts.logFormat, "log-format", "text", "log format: text or json", oneOf("text", "json"))
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

// parseLogLevel reads --log-level: logrus's level names.
func parseLogLevel(s string) (logrus.Level, error) {
	lvl, err := logrus.ParseLevel(s)
	if err != nil {
		return 0, errors.New("want trace, debug, info, warning or error")
	}
	return lvl, nil
}

// newLogger is the logger of --log-level and --log-format (text or json).
func newLogger(w io.Writer, level logrus.Level, format string) *logrus.Logger {
	log := logrus.New()
	log.SetOutput(w)
	log.SetLevel(level)
	if format == "json" {
		log.SetFormatter(&logrus.JSONFormatter{})
	} else {
		log.SetFormatter(&logrus.TextFormatter{})
	}
	return log
}
