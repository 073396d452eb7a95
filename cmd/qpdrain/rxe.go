package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
)

func init() { subcommands = append(subcommands, newRxeCmd) }

func newRxeCmd(opts *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rxe",
		Short: "Add, delete and list Soft-RoCE (rxe) links through RDMA netlink, as `rdma link add NAME type rxe netdev NETDEV`",
	}
	cmd.AddCommand(newRxeAddCmd(opts), newRxeDelCmd(opts), newRxeListCmd(opts))
	return cmd
}

// modprobe loads a kernel module and returns what modprobe said; tests
// replace it, so that they load nothing into the host's kernel.
var modprobe = func(module string) ([]byte, error) {
	return exec.Command("modprobe", module).CombinedOutput()
}

// loadRxe loads rdma_rxe when the kernel lacks it, and reports whether it
// did; an error is one line, and a kernel without the module exits 3.
func loadRxe(log *logrus.Logger, sysRoot string) (loaded bool, err error) {
	if _, err := os.Stat(filepath.Join(sysRoot, "module", "rdma_rxe")); err == nil {
		return false, nil
	}
	log.Info("rdma_rxe is not loaded: loading it (modprobe rdma_rxe)")
	out, err := modprobe("rdma_rxe")
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if strings.Contains(msg, "not found") {
			return false, withExitCode(exitUnsupported, fmt.Errorf("loading rdma_rxe: this kernel has no rdma_rxe module: %s", msg))
		}
		return false, withExitCode(exitError, fmt.Errorf("loading rdma_rxe (modprobe rdma_rxe): %v: %s", err, msg))
	}
	return true, nil
}

func newRxeAddCmd(opts *globalOptions) *cobra.Command {
	var host hostOptions
	cmd := &cobra.Command{
		Use:   "add NAME NETDEV",
		Short: "Create the rxe device NAME on the net device NETDEV (loads rdma_rxe when missing)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, netdev := args[0], args[1]
			if err := checkRxeArgs(name, netdev); err != nil {
				return err
			}
			loaded, err := loadRxe(opts.log, host.sys)
			if err != nil {
				return err
			}
			ctx, conn, done, err := host.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if err := conn.AddLink(ctx, name, "rxe", netdev); err != nil {
				return withExitCode(exitError, err)
			}
			if loaded {
				fmt.Fprintln(cmd.OutOrStdout(), "loaded rdma_rxe")
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added %s on %s\n", name, netdev)
			return nil
		},
	}
	host.flags(cmd, 10*time.Second)
	return cmd
}

// ibDeviceNameMax is IB_DEVICE_NAME_MAX (include/rdma/ib_verbs.h), with
// the terminating NUL.
const ibDeviceNameMax = 64

// errNoNetdev: the net device rxe add was given is not on this host.
var errNoNetdev = errors.New("no such net device")

// checkRxeArgs checks rxe add's arguments before it loads a module or
// asks the kernel anything: a name the kernel takes (ib_device_rename's
// rules: at most 63 bytes, no '/', no blank), a net device that exists
// (a typo: exit 2, naming it).
func checkRxeArgs(name, netdev string) error {
	switch {
	case name == "" || len(name) >= ibDeviceNameMax:
		return withExitCode(exitError, fmt.Errorf("rxe add: device name %q: want 1 to %d bytes", name, ibDeviceNameMax-1))
	case strings.ContainsAny(name, "/ \t\n") || name == "." || name == "..":
		return withExitCode(exitError, fmt.Errorf("rxe add: device name %q: want no '/' and no blank", name))
	}
	if _, err := net.InterfaceByName(netdev); err != nil {
		return withExitCode(exitError, fmt.Errorf("rxe add: %w %q here: %v", errNoNetdev, netdev, err))
	}
	return nil
}

// findDevice looks a device up by name.
func findDevice(ctx context.Context, conn *rdmanl.Conn, name string) (rdmanl.Device, error) {
	devs, err := conn.Devices(ctx)
	if err != nil {
		return rdmanl.Device{}, withExitCode(exitError, err)
	}
	for _, d := range devs {
		if d.Name == name {
			return d, nil
		}
	}
	return rdmanl.Device{}, withExitCode(exitError, fmt.Errorf("%q: %w", name, inventory.ErrNoSuchDevice))
}

func newRxeDelCmd(opts *globalOptions) *cobra.Command {
	var host hostOptions
	cmd := &cobra.Command{
		Use:   "del NAME",
		Short: "Delete the rxe device NAME, once no process holds it (bounded by --timeout)",
		Long: `Delete the rxe device NAME. The kernel's delete waits, unbounded and
uninterruptibly, until every process has closed the device, so qpdrain first
waits (bounded by --timeout) until no process holds the device's uverbs file
open or mapped, naming the holders while it waits and when it gives up.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, conn, done, err := host.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			dev, err := findDevice(ctx, conn, args[0])
			if err != nil {
				return err
			}
			if err := waitUnheld(ctx, conn, dev, host, cmd.ErrOrStderr()); err != nil {
				return withExitCode(exitError, err)
			}
			if err := conn.DeleteLink(ctx, dev); err != nil {
				return withExitCode(exitError, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %s\n", dev.Name)
			return nil
		},
	}
	host.flags(cmd, 10*time.Second)
	return cmd
}

// errHeld is a delete that gave up while processes still held the device.
var errHeld = errors.New("processes still hold the device")

// waitUnheld waits until no process holds dev's uverbs char device, saying
// who holds it when that changes, and fails naming them when ctx ends.
func waitUnheld(ctx context.Context, conn *rdmanl.Conn, dev rdmanl.Device, host hostOptions, w io.Writer) error {
	cd, err := conn.UverbsChardev(ctx, dev)
	if err != nil || cd.Name == "" {
		// A device without a uverbs char device has no user-space holders.
		return nil
	}
	path := filepath.Join(host.dev, "infiniband", cd.Name)
	proc := inventory.Proc{Root: host.proc}
	last := ""
	// A wait that ends at the caller's bound (--timeout, or reap's --wait)
	// names the bound: what is left of it when the wait starts.
	start := time.Now()
	var bound time.Duration
	if dl, ok := ctx.Deadline(); ok {
		bound = time.Until(dl).Round(100 * time.Millisecond)
		if bound >= time.Second {
			bound = bound.Round(time.Second)
		}
	}
	for {
		held, err := proc.Holders([]string{path})
		if err != nil {
			return fmt.Errorf("deleting %s: finding the processes that hold %s: %w", dev.Name, path, err)
		}
		hs := held[path]
		if len(hs) == 0 {
			return nil
		}
		names := holderList(hs)
		if names != last {
			fmt.Fprintf(w, "waiting for %s to be closed by %s\n", dev.Name, names)
			last = names
		}
		select {
		case <-ctx.Done():
			waited := time.Since(start).Round(100 * time.Millisecond)
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				waited = bound
			}
			return fmt.Errorf("deleting %s: %w after %v: %s", dev.Name, errHeld, waited, names)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func holderList(hs []inventory.Holder) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = fmt.Sprintf("pid %d (%s)", h.PID, h.Comm)
	}
	return strings.Join(parts, ", ")
}

// rxeLink is one line of `qpdrain rxe list`.
type rxeLink struct {
	IfIndex uint32 `json:"ifindex"`
	IfName  string `json:"ifname"`
	Port    uint32 `json:"port"`
	State   string `json:"state"`
	Netdev  string `json:"netdev"`
}

func newRxeListCmd(opts *globalOptions) *cobra.Command {
	var host hostOptions
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the rxe devices, their ports and net devices, as `rdma link show`",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, conn, done, err := host.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			devs, err := conn.Devices(ctx)
			if err != nil {
				return withExitCode(exitError, err)
			}
			links := []rxeLink{}
			for _, d := range devs {
				cd, err := conn.UverbsChardev(ctx, d)
				if err != nil || cd.DriverID != rdmanl.DriverRXE {
					continue
				}
				ports, err := conn.Ports(ctx, d)
				if err != nil {
					return withExitCode(exitError, err)
				}
				for _, p := range ports {
					links = append(links, rxeLink{IfIndex: d.Index, IfName: d.Name, Port: p.Port, State: p.State.String(), Netdev: p.Netdev})
				}
			}
			out := cmd.OutOrStdout()
			if opts.json {
				return json.NewEncoder(out).Encode(links)
			}
			for _, l := range links {
				fmt.Fprintf(out, "link %s/%d state %s netdev %s\n", l.IfName, l.Port, l.State, l.Netdev)
			}
			return nil
		},
	}
	host.flags(cmd, 10*time.Second)
	return cmd
}
