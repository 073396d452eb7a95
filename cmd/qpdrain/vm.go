package main

import (
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/vm"
)

func init() { subcommands = append(subcommands, newVMCmd) }

// vmOptions are the flags the vm subcommands share.
type vmOptions struct {
	kernels kernelList
	// envErr is why $RXE_KERNELS, the default of --kernels, is no list.
	envErr    error
	providers providerList
	// provEnvErr is why $RXE_PROVIDERS, the default of --providers, is no list.
	provEnvErr error
	cache      string
	accel      vm.Accel
	kvmDev     string
	timeout    time.Duration
}

func newVMCmd(opts *globalOptions) *cobra.Command {
	o := &vmOptions{}
	cmd := &cobra.Command{
		Use:   "vm",
		Short: "Run programs or Go tests on real Soft-RoCE (rdma_rxe) and soft iWARP (siw) in qemu, on a matrix of Debian kernels",
		Long: `Boot Debian's kernels (never installed on the host) in qemu with rxe0 up on a dummy netdev
(--providers siw: siw0 on a second one, its module built from the kernel's Debian source) and run
a command or a Go module's tests inside, once per kernel and provider, with one verdict. KVM when
/dev/kvm is usable, TCG otherwise. A run fails on a non-zero exit, a failed test, a guest panic,
Oops or BUG, or a hang (the deadline, naming the last stage). Kernels are downloaded through a
private apt configuration into the cache and pinned there once resolved; a warm cache touches no
network. See docs/VM.md.
Exit status 0 when every kernel passed, 1 when one failed, 2 on bad arguments, 3 when this host
cannot run it (packages missing and not root, no network for a cold cache).`,
		// A runnable parent, so that an unknown subcommand is an error (exit
		// 2) instead of the help and exit 0.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	pf := cmd.PersistentFlags()
	var def kernelList
	def, o.envErr = parseKernelList(os.Getenv("RXE_KERNELS"))
	wordFlag(pf, &o.kernels, "kernels", def, "kernels, comma-separated: 6.1, 6.12, newest, 5.10 (not in the default), default, all (default $RXE_KERNELS, else 6.1,6.12,newest)", parseKernelList)
	var defProv providerList
	defProv, o.provEnvErr = parseProviderList(os.Getenv("RXE_PROVIDERS"))
	wordFlag(pf, &o.providers, "providers", defProv, "providers, comma-separated: rxe (rxe0), siw (siw0, its module built per kernel), all; the payload runs once per provider (default $RXE_PROVIDERS, else rxe)", parseProviderList)
	pf.StringVar(&o.cache, "cache", "", "cache directory (default $QPDRAIN_VM_CACHE, else the user's cache dir/qpdrain/vm)")
	wordFlag(pf, &o.accel, "accel", vm.AccelAuto, "qemu accelerator: auto (KVM when it starts the guest, else TCG), kvm or tcg", vm.ParseAccel)
	pf.StringVar(&o.kvmDev, "kvm-device", "", "the KVM device auto probes (default $QPDRAIN_VM_KVM_DEVICE, else /dev/kvm; a missing path means no KVM)")
	durationFlag(pf, &o.timeout, "timeout", 0, "deadline of each VM, at least 1s, after which it is killed and the run fails (default $RXE_TIMEOUT seconds, else 480s)", atLeastDuration(time.Second))
	cmd.AddCommand(newVMRunCmd(o), newVMGoTestCmd(o), newVMKernelsCmd(opts, o))
	return cmd
}

func newVMRunCmd(o *vmOptions) *cobra.Command {
	spec := vm.RunSpec{}
	cmd := &cobra.Command{
		Use:   "run [--kernels LIST] [--files PATH...] [--python] -- CMD [ARGS...]",
		Short: "Run a command in the guest, with rxe0 up, on each kernel",
		Long: `Run CMD in the guest on each kernel, once per provider, with its device up and in its
environment: rxe, QPDRAIN_TEST_DEVICE=rxe0, QPDRAIN_TEST_GID_INDEX (rxe0's RoCE v2 GID of
QPDRAIN_TEST_ADDR) and QPDRAIN_TEST_ADDR=10.11.12.13; siw, QPDRAIN_TEST_DEVICE=siw0 and
QPDRAIN_TEST_ADDR=10.11.13.13 (iWARP has no GID index to pick). CMD and every --files path are copied from the host at their own
paths, with every library ldd names; CMD runs in the current directory's path. Its exit status,
output and the kernel log are carried out. The closing line counts kernels: N passed, N failed.
A payload the guest's memory (RXE_MEM, 1024 MiB) cannot hold is refused before anything starts,
exit 2, with its size and the memory it needs (docs/VM.md).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			vo, err := o.resolve(cmd)
			if err != nil {
				return err
			}
			spec.Command = args
			spec.Dir, err = os.Getwd()
			if err != nil {
				return withExitCode(exitError, fmt.Errorf("vm run: %w", err))
			}
			return vmVerdict("run", vm.Run(cmdContext(cmd), vo, spec))
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().StringArrayVar(&spec.Files, "files", nil, "file or directory to copy in at its own path (repeatable)")
	cmd.Flags().BoolVar(&spec.Python, "python", false, "bring the host's /usr/bin/python3 and its standard library (python3 as CMD means it)")
	return cmd
}

func newVMGoTestCmd(o *vmOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "go-test [--kernels LIST] PKGS... [-- TESTFLAGS...]",
		Short: "Build a Go module's tests on the host and run them in the guest on each kernel",
		Long: `Build the test binaries of PKGS (directories as go test takes them: ./..., ./pkg) of the
Go module in the current directory with go test -c ($RXE_GO_TEST_FLAGS adds flags, e.g. -race),
and run each in the guest in a copy of its package directory with -test.v and TESTFLAGS (in the
binary's spelling: -test.run=^TestX), once per provider with its environment (see vm run).
The closing line counts the tests of every kernel: N passed, N failed.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			vo, err := o.resolve(cmd)
			if err != nil {
				return err
			}
			pkgs, flags := args, []string(nil)
			if at := cmd.ArgsLenAtDash(); at >= 0 {
				pkgs, flags = args[:at], args[at:]
			}
			dir, err := os.Getwd()
			if err != nil {
				return withExitCode(exitError, fmt.Errorf("vm go-test: %w", err))
			}
			return vmVerdict("go-test", vm.GoTest(cmdContext(cmd), vo, dir, pkgs, flags))
		},
	}
}

func newVMKernelsCmd(opts *globalOptions, o *vmOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "kernels",
		Short: "List the kernel names, what each resolves to in the cache, the cached kernels and their siw.ko",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vo, err := o.resolve(cmd)
			if err != nil {
				return err
			}
			ks, err := vm.ListCache(vo.Cache)
			if err != nil {
				return withExitCode(exitError, fmt.Errorf("vm kernels: %w", err))
			}
			if opts.json {
				return printJSON(cmd.OutOrStdout(), ks)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "cache %s\n", vo.Cache)
			fmt.Fprintln(w, "NAME\tSUITE\tDEFAULT\tRESOLVES TO\tPACKAGE\tCACHED\tSIW.KO FROM")
			for _, k := range ks {
				name, suite, def := k.Name, k.Suite, "no"
				if name == "" {
					name, suite, def = "-", "-", "-"
				} else if k.Default {
					def = "yes"
				}
				version, pkg, cached := k.Version, k.Package, "yes"
				if version == "" {
					version, pkg = "(not resolved yet)", "-"
				}
				if k.Dir == "" {
					cached = "no"
				}
				if pkg == "" {
					pkg = "-"
				}
				siw := k.SIW
				if siw == "" {
					siw = "-"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, suite, def, version, pkg, cached, siw)
			}
			return w.Flush()
		},
	}
}

// kernelList is a --kernels value: the list as given, and the kernels
// vm.ParseKernels resolves it to.
type kernelList struct {
	names string
	ks    []vm.Kernel
}

// String is the list as given, the flag's default.
func (l kernelList) String() string { return l.names }

func parseKernelList(s string) (kernelList, error) {
	ks, err := vm.ParseKernels(s)
	return kernelList{s, ks}, err
}

// providerList is a --providers value: the list as given, and the providers
// vm.ParseProviders resolves it to.
type providerList struct {
	names string
	ps    []vm.Provider
}

// String is the list as given, the flag's default.
func (l providerList) String() string { return l.names }

func parseProviderList(s string) (providerList, error) {
	ps, err := vm.ParseProviders(s)
	return providerList{s, ps}, err
}

// resolve turns the flags into vm.Options; a bad $RXE_KERNELS or
// $RXE_PROVIDERS, the defaults the flags cannot check when they are read,
// exits 2.
func (o *vmOptions) resolve(cmd *cobra.Command) (vm.Options, error) {
	if o.envErr != nil && !cmd.Flags().Changed("kernels") {
		return vm.Options{}, withExitCode(exitError, fmt.Errorf("$RXE_KERNELS: %w", o.envErr))
	}
	if o.provEnvErr != nil && !cmd.Flags().Changed("providers") {
		return vm.Options{}, withExitCode(exitError, fmt.Errorf("$RXE_PROVIDERS: %w", o.provEnvErr))
	}
	cache := o.cache
	if cache == "" {
		var err error
		if cache, err = vm.DefaultCacheDir(); err != nil {
			return vm.Options{}, withExitCode(exitError, err)
		}
	}
	return vm.Options{Kernels: o.kernels.ks, Providers: o.providers.ps, Cache: cache, Accel: o.accel, KVMDevice: o.kvmDev, Timeout: o.timeout, Stdout: cmd.OutOrStdout()}, nil
}

// vmVerdict maps a run's error to qpdrain's exit codes: 1 a failed verdict
// (already printed), 3 this host cannot run VMs, 2 anything else.
func vmVerdict(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, vm.ErrFailed):
		return withExitCode(exitFindings, err)
	case errors.Is(err, vm.ErrCannotRun):
		return withExitCode(exitUnsupported, fmt.Errorf("vm %s: %w", what, err))
	default:
		return withExitCode(exitError, fmt.Errorf("vm %s: %w", what, err))
	}
}
