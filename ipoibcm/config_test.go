package ipoibcm

import (
	"encoding/json"
	"testing"
)

// TestPolicyText: a policy is written as its name and read back from it,
// in JSON too; another word is an error naming the two.
func TestPolicyText(t *testing.T) {
	for _, p := range []Policy{Kernel, Bounded} {
		b, err := json.Marshal(struct{ P Policy }{p})
		if want := `{"P":"` + p.String() + `"}`; err != nil || string(b) != want {
			t.Errorf("json.Marshal(%v) = %s, %v; want %s", p, b, err, want)
		}
		var back struct{ P Policy }
		if err := json.Unmarshal(b, &back); err != nil || back.P != p {
			t.Errorf("json.Unmarshal(%s) = %v, %v; want %v", b, back.P, err, p)
		}
	}
	var p Policy
	if err := p.UnmarshalText([]byte("fast")); err == nil || err.Error() != `policy "fast": want kernel or bounded` {
		t.Errorf("UnmarshalText(fast) = %v, want the error naming kernel and bounded", err)
	}
}
