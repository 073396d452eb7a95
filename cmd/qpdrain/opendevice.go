package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
)

// softDeviceName selects the built-in soft device with --device, as does
// softDefaultName, the name it is opened with and prints (soft.Config.Name's
// default).
// softIWARPName picks it with siw's rules (soft.Config.Transport iWARP),
// spelled as the device tests' soft:adversarial.
const (
	softDeviceName  = "soft"
	softDefaultName = "soft0"
	softIWARPName   = "soft:iwarp"
)

// isSoftDevice reports whether name picks the built-in soft device: "soft",
// "soft:iwarp", or the name it prints for itself.
func isSoftDevice(name string) bool {
	return name == softDeviceName || name == softDefaultName || name == softIWARPName
}

// deviceChoice is what a command's flags say about the device it runs on.
type deviceChoice struct {
	// name is --device: "soft" or "soft0" for the built-in soft device
	// ("soft:iwarp" with siw's rules),
	// any other name for a libibverbs device, "" for the first device
	// libibverbs lists, or the soft device when there is none.
	name string
	// softOnly are the flags given that only the soft device takes, as
	// the operator spells them ("--soft-quirk"): without a name they pick
	// the soft device, beside a libibverbs device's name they are refused.
	softOnly []string
	// soft configures the soft device, when it is the one opened.
	soft soft.Config
}

// openedDevice is the device a command runs on.
type openedDevice struct {
	ibv.Context
	// soft is the built-in soft device when it is the one opened, nil for
	// a libibverbs device.
	soft *soft.Device
	// note says why the soft device was picked when --device did not
	// name it; "" otherwise.
	note string
}

// openDevice opens the device c picks, for every command that opens one.
// A libibverbs device that is not here, or a build or machine without
// libibverbs, is an error that exits 3 (errNotHere), whose message names
// the soft device as the alternative; soft-only flags beside a libibverbs
// device are an error (exit 2).
func openDevice(c deviceChoice) (*openedDevice, error) {
	d := &openedDevice{}
	name := c.name
	if name == "" && len(c.softOnly) > 0 {
		name, d.note = softDeviceName, andList(c.softOnly)+" given"
	}
	if name == "" {
		infos, err := ibv.Devices()
		switch {
		case errors.Is(err, ibv.ErrNotSupported):
			name, d.note = softDeviceName, noLibibverbs()
		case errors.Is(err, ibv.ErrNoDevice) || err == nil && len(infos) == 0:
			name, d.note = softDeviceName, "no RDMA device on this machine"
		case err != nil:
			return nil, fmt.Errorf("listing RDMA devices: %w", err)
		default:
			name = infos[0].Name
		}
	}
	if isSoftDevice(name) {
		if name == softIWARPName {
			c.soft.Transport = ibv.TransportIWARP
		}
		dev, err := soft.Open(c.soft)
		if err != nil {
			return nil, fmt.Errorf("opening the soft device: %w", err)
		}
		d.Context, d.soft = dev, dev
		return d, nil
	}
	if n := len(c.softOnly); n > 0 {
		verb := "applies"
		if n > 1 {
			verb = "apply"
		}
		return nil, fmt.Errorf("%s %s to the soft device only, not %s", andList(c.softOnly), verb, name)
	}
	dev, err := openVerbsDevice(name)
	if err != nil {
		return nil, err
	}
	d.Context = dev
	return d, nil
}

// openVerbsDevice opens the RDMA device name through libibverbs, with the
// error an operator needs: a missing device, or a build or machine without
// libibverbs, exits 3. openDevice opens through it, and so does every
// command that opens a device another listing named.
func openVerbsDevice(name string) (ibv.Context, error) {
	dev, err := ibv.Open(name)
	switch {
	case errors.Is(err, ibv.ErrNoDevice):
		return nil, fmt.Errorf("%w %q here (%q is the built-in soft device)", ibv.ErrNoDevice, name, softDeviceName)
	case errors.Is(err, ibv.ErrNotSupported):
		return nil, fmt.Errorf("RDMA device %q: %w (%v); %q is the built-in soft device", name, errNoVerbs, err, softDeviceName)
	case err != nil:
		return nil, fmt.Errorf("opening %s: %w", name, err)
	}
	return dev, nil
}

// andList is "a", "a and b", "a, b and c".
func andList(words []string) string {
	if n := len(words); n > 1 {
		return strings.Join(words[:n-1], ", ") + " and " + words[n-1]
	}
	return strings.Join(words, "")
}

// softQuirks is the value of a quirk flag (quirkFlag): the quirk names
// given, in order, and the soft.Quirks they switch on.
type softQuirks struct {
	names  []string
	quirks soft.Quirks
}

// quirkFlag defines the repeatable flag that switches on provider quirks of
// the soft device; a value may be a comma-separated list. Each name is
// checked when it is set, so that an unknown one is refused (exit 2) before
// the command does anything.
func quirkFlag(f *pflag.FlagSet, q *softQuirks, name string) {
	f.Var(q, name, "provider quirk of the soft device (repeatable): "+strings.Join(soft.QuirkNames(), ", "))
}

func (q *softQuirks) Set(s string) error {
	names := append(slices.Clip(q.names), strings.Split(s, ",")...)
	quirks, err := soft.ParseQuirks(names)
	if err != nil {
		return err
	}
	q.names, q.quirks = names, quirks
	return nil
}

func (q *softQuirks) Type() string   { return "strings" }
func (q *softQuirks) String() string { return strings.Join(q.names, ",") }

// quirkList is quirk names for text: "none", or the names.
func quirkList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
