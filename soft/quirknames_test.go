package soft_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/qpdrain/qpdrain/soft"
)

// Every switch of soft.Quirks has a name (the CLI's --quirk and --soft-quirk), and
// each name sets exactly one, so the CLI can set every deviation the soft
// device can reproduce.
func TestQuirkNamesCoverQuirks(t *testing.T) {
	fields := reflect.TypeFor[soft.Quirks]()
	named := make(map[string]string, fields.NumField())
	for _, name := range soft.QuirkNames() {
		q, err := soft.ParseQuirks([]string{name})
		if err != nil {
			t.Fatalf("ParseQuirks(%q): %v", name, err)
		}
		v := reflect.ValueOf(q)
		var set []string
		for i := range fields.NumField() {
			if v.Field(i).Bool() {
				set = append(set, fields.Field(i).Name)
			}
		}
		if len(set) != 1 {
			t.Errorf("quirk %s sets %v, want one switch", name, set)
			continue
		}
		if other, dup := named[set[0]]; dup {
			t.Errorf("quirks %s and %s both set %s", other, name, set[0])
		}
		named[set[0]] = name
	}
	for i := range fields.NumField() {
		if f := fields.Field(i).Name; named[f] == "" {
			t.Errorf("soft.Quirks.%s has no quirk name", f)
		}
	}
}

// An unknown name is ErrUnknownQuirk and sets nothing.
func TestParseQuirksUnknown(t *testing.T) {
	q, err := soft.ParseQuirks([]string{"no-last-wqe-reached", "no-such-quirk"})
	if !errors.Is(err, soft.ErrUnknownQuirk) || q != (soft.Quirks{}) {
		t.Errorf("ParseQuirks(unknown) = %+v, %v; want no quirks and ErrUnknownQuirk", q, err)
	}
}
