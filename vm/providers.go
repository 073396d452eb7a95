package vm

import (
	"errors"
	"fmt"
	"strings"
)

// Provider is a kernel RDMA provider the guest sets up, each on a netdev and
// address of its own, so that the RDMA CM resolves each address to one
// device.
type Provider string

// The providers a guest can set up.
const (
	// ProviderRXE is Soft-RoCE (rdma_rxe): rxe0 on dummy0, 10.11.12.13.
	ProviderRXE Provider = "rxe"
	// ProviderSIW is soft iWARP (siw): siw0 on dummy_siw, 10.11.13.13. Debian's
	// kernels do not build it: the run builds siw.ko per kernel from that
	// kernel's Debian source and headers packages (docs/VM.md).
	ProviderSIW Provider = "siw"
)

// Providers lists every provider, in the order a run takes them.
var Providers = []Provider{ProviderRXE, ProviderSIW}

// ErrUnknownProvider is returned for a provider name not in Providers.
var ErrUnknownProvider = errors.New("unknown provider")

// DefaultProviders returns the providers a run takes when none are named:
// rxe alone.
func DefaultProviders() []Provider { return []Provider{ProviderRXE} }

// Device is the provider's device in the guest: rxe0, siw0.
func (p Provider) Device() string { return string(p) + "0" }

// ParseProviders resolves a list of names separated by commas or spaces:
// rxe, siw, or "all". An empty list gives DefaultProviders. A name given
// twice runs once; the run takes them in the order of Providers. An unknown
// name is an error wrapping ErrUnknownProvider.
func ParseProviders(list string) ([]Provider, error) {
	words := strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
	if len(words) == 0 {
		return DefaultProviders(), nil
	}
	want := map[Provider]bool{}
	for _, w := range words {
		if w == "all" {
			for _, p := range Providers {
				want[p] = true
			}
			continue
		}
		p := Provider(w)
		if !known(p) {
			return nil, fmt.Errorf("provider %q: %w (want rxe, siw or all)", w, ErrUnknownProvider)
		}
		want[p] = true
	}
	var ps []Provider
	for _, p := range Providers {
		if want[p] {
			ps = append(ps, p)
		}
	}
	return ps, nil
}

func known(p Provider) bool {
	for _, q := range Providers {
		if p == q {
			return true
		}
	}
	return false
}
