package vm

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// scripts holds the shell side of the harness; Prepare writes it out.
//
//go:embed scripts
var scripts embed.FS

// writeScripts writes the embedded scripts into cache/scripts/HASH (HASH of
// their contents, so binaries of different versions sharing a cache never
// mix scripts) and returns that directory. An existing copy is reused.
func writeScripts(cache string) (string, error) {
	h := sha256.New()
	var names []string
	err := fs.WalkDir(scripts, "scripts", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := scripts.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
		names = append(names, p)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("reading the embedded scripts: %w", err)
	}
	dir := filepath.Join(cache, "scripts", hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(filepath.Join(dir, "vm.sh")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", fmt.Errorf("creating the scripts directory: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".new-")
	if err != nil {
		return "", fmt.Errorf("creating the scripts directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	for _, p := range names {
		b, _ := scripts.ReadFile(p) // read above
		if err := os.WriteFile(filepath.Join(tmp, filepath.Base(p)), b, 0o755); err != nil {
			return "", fmt.Errorf("writing the scripts: %w", err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) {
		if _, serr := os.Stat(filepath.Join(dir, "vm.sh")); serr != nil {
			return "", fmt.Errorf("installing the scripts: %w", err)
		}
	}
	return dir, nil
}
