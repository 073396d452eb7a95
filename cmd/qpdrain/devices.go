package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/jaypipes/ghw"
	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/ibv"
)

func init() { subcommands = append(subcommands, newDevicesCmd) }

// sysfsIB is where the kernel lists RDMA devices.
const sysfsIB = "/sys/class/infiniband"

// errNoDevices is what the devices command says on a machine without RDMA.
var errNoDevices = errors.New("no RDMA devices")

func newDevicesCmd(opts *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "devices",
		Short: "List RDMA devices, their ports, GIDs and the PCI device and NIC behind each",
		Long: `List the RDMA devices libibverbs sees: node type, transport, GUID and firmware;
each port's state, link layer, MTU and LID; its GID table with types and the netdev each
GID belongs to; and, through ghw, the PCI function and NICs behind the device (software
devices such as rxe have none). Exits 3 on a machine without RDMA devices (with -j, the
error document, as every command).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			devs, err := listDevices(opts)
			if err != nil {
				return err
			}
			if opts.json {
				return printJSON(cmd.OutOrStdout(), devs)
			}
			printDevices(cmd.OutOrStdout(), devs, opts.details)
			return nil
		},
	}
}

// deviceReport is one RDMA device; the JSON names follow iproute2's rdma
// tool where they overlap (ifname is the RDMA device's name there).
type deviceReport struct {
	Name      string       `json:"ifname"`
	NodeType  string       `json:"node_type"`
	Transport string       `json:"transport"`
	NodeGUID  string       `json:"node_guid"`
	FWVer     string       `json:"fw"`
	PCI       *pciReport   `json:"pci"`
	NICs      []nicReport  `json:"nics"`
	Ports     []portReport `json:"ports"`
}

type pciReport struct {
	Address string `json:"address"`
	Vendor  string `json:"vendor"`
	Product string `json:"product"`
	Driver  string `json:"driver"`
}

type nicReport struct {
	Name       string `json:"netdev"`
	MAC        string `json:"mac"`
	PCIAddress string `json:"pci_address,omitempty"`
	Virtual    bool   `json:"virtual"`
}

type portReport struct {
	Port      uint8       `json:"port"`
	State     string      `json:"state"`
	PhysState uint8       `json:"physical_state"`
	LinkLayer string      `json:"link_layer"`
	ActiveMTU int         `json:"active_mtu"`
	LID       uint16      `json:"lid"`
	Netdev    string      `json:"netdev,omitempty"`
	GIDs      []gidReport `json:"gids"`
}

type gidReport struct {
	Index  uint32 `json:"index"`
	GID    string `json:"gid"`
	Type   string `json:"type"`
	Netdev string `json:"netdev,omitempty"`
}

func listDevices(opts *globalOptions) ([]deviceReport, error) {
	infos, err := ibv.Devices()
	if why := noLibibverbs(); why != "" {
		return nil, withExitCode(exitUnsupported, fmt.Errorf("%w: %s", errNoDevices, why))
	}
	if errors.Is(err, ibv.ErrNoDevice) || errors.Is(err, ibv.ErrNotSupported) || err == nil && len(infos) == 0 {
		if err != nil {
			opts.log.WithError(err).Debug("listing RDMA devices")
		}
		return nil, withExitCode(exitUnsupported, errNoDevices)
	}
	if err != nil {
		return nil, withExitCode(exitError, err)
	}
	hw := newHardware(opts)
	out := make([]deviceReport, 0, len(infos))
	for _, info := range infos {
		d, err := describeDevice(info, hw)
		if err != nil {
			return nil, withExitCode(exitError, err)
		}
		out = append(out, d)
	}
	return out, nil
}

func describeDevice(info ibv.DeviceInfo, hw *hardware) (deviceReport, error) {
	d := deviceReport{
		Name:      info.Name,
		NodeType:  info.NodeType.String(),
		Transport: info.Transport.String(),
		NodeGUID:  formatGUID(info.GUID),
		NICs:      []nicReport{},
		Ports:     []portReport{},
	}
	ctx, err := openVerbsDevice(info.Name)
	if err != nil {
		return d, err
	}
	defer ctx.Close()
	attr, err := ctx.QueryDevice()
	if err != nil {
		return d, err
	}
	d.FWVer = attr.FWVer
	gids, err := ctx.QueryGIDTable()
	if err != nil {
		return d, err
	}
	for p := uint8(1); p <= attr.PhysPortCnt; p++ {
		pa, err := ctx.QueryPort(p)
		if err != nil {
			return d, err
		}
		pr := portReport{
			Port:      p,
			State:     pa.State.String(),
			PhysState: pa.PhysState,
			LinkLayer: pa.LinkLayer.String(),
			ActiveMTU: pa.ActiveMTU.Bytes(),
			LID:       pa.LID,
			GIDs:      []gidReport{},
		}
		for _, g := range gids {
			if g.Port != p {
				continue
			}
			gr := gidReport{Index: g.Index, GID: g.GID.String(), Type: g.Type.String(), Netdev: gidNetdev(info.Name, g)}
			if pr.Netdev == "" {
				pr.Netdev = gr.Netdev
			}
			pr.GIDs = append(pr.GIDs, gr)
		}
		d.Ports = append(d.Ports, pr)
	}
	d.PCI, d.NICs = hw.behind(info.Name, d.Ports)
	return d, nil
}

// gidNetdev names the netdev a GID belongs to: from the GID table entry's
// ifindex, else from sysfs (gid_attrs/ndevs).
func gidNetdev(dev string, g ibv.GIDEntry) string {
	if g.NetdevIndex != 0 {
		if ifi, err := net.InterfaceByIndex(int(g.NetdevIndex)); err == nil {
			return ifi.Name
		}
	}
	b, err := os.ReadFile(filepath.Join(sysfsIB, dev, "ports", fmt.Sprint(g.Port), "gid_attrs", "ndevs", fmt.Sprint(g.Index)))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// formatGUID prints a GUID as ibv_devinfo does (0250:56ff:fe00:0001).
func formatGUID(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

// hardware is the PCI and NIC inventory from ghw, each read once and only
// when needed. A failure leaves it empty and is logged: the RDMA part of the
// report does not depend on it.
type hardware struct {
	nics func() []*ghw.NIC
	// pci is read only for a device that has a PCI function: pcidb warns
	// when it finds no pci.ids database, which says nothing about a
	// software device such as rxe.
	pci func() *ghw.PCIInfo
}

func newHardware(opts *globalOptions) *hardware {
	return &hardware{
		nics: readOnce(opts, "NIC", func() ([]*ghw.NIC, error) {
			nets, err := ghw.Network(ghw.WithDisableWarnings())
			if err != nil {
				return nil, err
			}
			return nets.NICs, nil
		}),
		pci: readOnce(opts, "PCI", func() (*ghw.PCIInfo, error) { return ghw.PCI(ghw.WithDisableWarnings()) }),
	}
}

// readOnce returns a function that reads the what inventory when first
// called and returns it from then on; a failure is logged, once, and leaves
// it empty (T's zero value).
func readOnce[T any](opts *globalOptions, what string, read func() (T, error)) func() T {
	return sync.OnceValue(func() T {
		v, err := read()
		if err != nil {
			opts.log.WithError(err).Warn("reading the " + what + " inventory")
			var zero T
			return zero
		}
		return v
	})
}

// behind returns the PCI function of an RDMA device (nil for a software
// device such as rxe, whose sysfs entry has no "device" link) and the NICs
// it uses: those on the same PCI function, and the netdevs its ports use.
func (h *hardware) behind(dev string, ports []portReport) (*pciReport, []nicReport) {
	var pr *pciReport
	addr := ""
	if target, err := os.Readlink(filepath.Join(sysfsIB, dev, "device")); err == nil {
		addr = filepath.Base(target)
		pr = pciFunction(h.pci(), addr)
	}
	netdevs := map[string]bool{}
	for _, p := range ports {
		for _, g := range p.GIDs {
			if g.Netdev != "" {
				netdevs[g.Netdev] = true
			}
		}
	}
	nics := []nicReport{}
	for _, n := range h.nics() {
		onPCI := addr != "" && n.PCIAddress != nil && *n.PCIAddress == addr
		if !onPCI && !netdevs[n.Name] {
			continue
		}
		nr := nicReport{Name: n.Name, MAC: n.MACAddress, Virtual: n.IsVirtual}
		if n.PCIAddress != nil {
			nr.PCIAddress = *n.PCIAddress
		}
		nics = append(nics, nr)
		delete(netdevs, n.Name)
	}
	// Netdevs ghw does not list (it skips some virtual ones) still count.
	rest := make([]string, 0, len(netdevs))
	for name := range netdevs {
		rest = append(rest, name)
	}
	sort.Strings(rest)
	for _, name := range rest {
		nics = append(nics, nicReport{Name: name, Virtual: true})
	}
	return pr, nics
}

// pciFunction describes the PCI function at addr, with its vendor, product
// and driver when the inventory pci (nil when it could not be read) knows
// them.
func pciFunction(pci *ghw.PCIInfo, addr string) *pciReport {
	pr := &pciReport{Address: addr}
	if pci == nil {
		return pr
	}
	pd := pci.GetDevice(addr)
	if pd == nil {
		return pr
	}
	if pd.Vendor != nil {
		pr.Vendor = pd.Vendor.Name
	}
	if pd.Product != nil {
		pr.Product = pd.Product.Name
	}
	pr.Driver = pd.Driver
	return pr
}

func printDevices(w io.Writer, devs []deviceReport, details bool) {
	for _, d := range devs {
		fmt.Fprintf(w, "%s: node_type %s transport %s node_guid %s", d.Name, d.NodeType, d.Transport, d.NodeGUID)
		if d.FWVer != "" {
			fmt.Fprintf(w, " fw %s", d.FWVer)
		}
		fmt.Fprintln(w)
		if d.PCI == nil {
			fmt.Fprintln(w, "    pci none (software device: no PCI function behind it)")
		} else {
			fmt.Fprintf(w, "    pci %s %s %s driver %s\n", d.PCI.Address, d.PCI.Vendor, d.PCI.Product, d.PCI.Driver)
		}
		for _, n := range d.NICs {
			kind := "physical"
			if n.Virtual {
				kind = "virtual"
			}
			fmt.Fprintf(w, "    nic %s %s mac %s", n.Name, kind, n.MAC)
			if n.PCIAddress != "" {
				fmt.Fprintf(w, " pci %s", n.PCIAddress)
			}
			fmt.Fprintln(w)
		}
		for _, p := range d.Ports {
			fmt.Fprintf(w, "    port %d state %s link_layer %s active_mtu %d lid %d", p.Port, p.State, p.LinkLayer, p.ActiveMTU, p.LID)
			if p.Netdev != "" {
				fmt.Fprintf(w, " netdev %s", p.Netdev)
			}
			if details {
				fmt.Fprintf(w, " physical_state %d", p.PhysState)
			}
			fmt.Fprintln(w)
			for _, g := range p.GIDs {
				fmt.Fprintf(w, "        gid %d %s %s", g.Index, g.GID, g.Type)
				if g.Netdev != "" {
					fmt.Fprintf(w, " netdev %s", g.Netdev)
				}
				fmt.Fprintln(w)
			}
		}
	}
}
