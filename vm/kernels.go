package vm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Kernel is one entry of the kernel matrix: a name and the Debian suite whose
// linux-image-amd64 metapackage picks the kernel when the name is first
// resolved.
type Kernel struct {
	// Name is what --kernels takes: "6.1", "6.12", "newest", "5.10".
	Name string `json:"name"`
	// Suite is the Debian suite the kernel comes from.
	Suite string `json:"suite"`
	// Default is true for the kernels a run takes when none are named.
	Default bool `json:"default"`
}

// Kernels is the matrix: Debian 12's kernel, bookworm-backports' 6.12, and
// the newest kernel the Debian archive offers with a valid signature
// (trixie-backports; sid's and experimental's Release files can be expired on
// a mirror snapshot, and apt refuses them), the one current distributions run.
// Debian 11's 5.10, which fleets still run, is there on request only: its rxe
// soft-locks a CPU in some of qpdrain check's probes (docs/PROVIDERS.md), and
// the default matrix is what every CI run pays for.
var Kernels = []Kernel{
	{Name: "6.1", Suite: "bookworm", Default: true},
	{Name: "6.12", Suite: "bookworm-backports", Default: true},
	{Name: "newest", Suite: "trixie-backports", Default: true},
	{Name: "5.10", Suite: "bullseye"},
}

// ErrUnknownKernel is returned for a kernel name that is neither a name nor a
// suite of Kernels.
var ErrUnknownKernel = errors.New("unknown kernel")

// DefaultKernels returns the kernels a run takes when none are named.
func DefaultKernels() []Kernel {
	var ks []Kernel
	for _, k := range Kernels {
		if k.Default {
			ks = append(ks, k)
		}
	}
	return ks
}

// ParseKernels resolves a list of names separated by commas or spaces: a
// name of Kernels, its suite (bookworm, as RXE_KERNELS has always taken), or
// "default" and "all". An empty list gives DefaultKernels. A name given twice
// runs once. An unknown name is an error wrapping ErrUnknownKernel.
func ParseKernels(list string) ([]Kernel, error) {
	words := strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
	if len(words) == 0 {
		return DefaultKernels(), nil
	}
	var ks []Kernel
	seen := map[string]bool{}
	add := func(k Kernel) {
		if !seen[k.Name] {
			seen[k.Name] = true
			ks = append(ks, k)
		}
	}
	for _, w := range words {
		switch w {
		case "default":
			for _, k := range DefaultKernels() {
				add(k)
			}
			continue
		case "all":
			for _, k := range Kernels {
				add(k)
			}
			continue
		}
		k, ok := lookupKernel(w)
		if !ok {
			return nil, fmt.Errorf("kernel %q: %w (want %s, default or all)", w, ErrUnknownKernel, kernelNames())
		}
		add(k)
	}
	return ks, nil
}

func lookupKernel(w string) (Kernel, bool) {
	for _, k := range Kernels {
		if w == k.Name || w == k.Suite {
			return k, true
		}
	}
	return Kernel{}, false
}

func kernelNames() string {
	var ns []string
	for _, k := range Kernels {
		ns = append(ns, k.Name+" ("+k.Suite+")")
	}
	return strings.Join(ns, ", ")
}

// CachedKernel is what the cache knows about one kernel name, or about a
// kernel directory no name points at. Every field is in its JSON, empty
// when unknown, so that every entry has the same keys.
type CachedKernel struct {
	Kernel
	// Version is the kernel release the name is pinned to (uname -r), empty
	// when the name was never resolved with this cache.
	Version string `json:"version"`
	// Package is the Debian package and version it came from.
	Package string `json:"package"`
	// Dir is the kernel's directory in the cache; empty when not cached.
	Dir string `json:"dir"`
	// SIW is the source package and version siw.ko was built from for this
	// kernel (build-siw.sh), empty when it was not built.
	SIW string `json:"siw"`
}

// ListCache reports every name of Kernels with what it resolves to in the
// cache at dir, then the cached kernels no name resolves to (a suite resolved
// again, or a name from an older matrix). A missing cache directory is an
// empty cache, not an error.
func ListCache(dir string) ([]CachedKernel, error) {
	kdir := filepath.Join(dir, "kernels")
	var out []CachedKernel
	used := map[string]bool{}
	for _, k := range Kernels {
		c := CachedKernel{Kernel: k}
		ref, err := os.ReadFile(filepath.Join(kdir, k.Suite+".ref"))
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("reading the pin of %s: %w", k.Name, err)
		default:
			c.Version = strings.TrimSpace(string(ref))
			if d := filepath.Join(kdir, c.Version); complete(d) {
				c.Dir = d
				c.Package = readLine(filepath.Join(d, "package"))
				c.SIW = siwBuilt(d)
				used[c.Version] = true
			}
		}
		out = append(out, c)
	}
	ents, err := os.ReadDir(kdir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("listing cached kernels: %w", err)
	}
	var rest []string
	for _, e := range ents {
		if e.IsDir() && !used[e.Name()] && complete(filepath.Join(kdir, e.Name())) {
			rest = append(rest, e.Name())
		}
	}
	sort.Strings(rest)
	for _, v := range rest {
		d := filepath.Join(kdir, v)
		out = append(out, CachedKernel{Version: v, Dir: d, Package: readLine(filepath.Join(d, "package")), SIW: siwBuilt(d)})
	}
	return out, nil
}

// siwBuilt returns what siw.ko in the kernel directory d was built from,
// or "" when build-siw.sh did not finish it.
func siwBuilt(d string) string {
	if !complete(filepath.Join(d, "siw")) {
		return ""
	}
	return readLine(filepath.Join(d, "siw", "package"))
}

// complete reports whether fetch-kernel.sh finished the kernel directory d.
func complete(d string) bool {
	_, err := os.Stat(filepath.Join(d, ".complete"))
	return err == nil
}

func readLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
