package drain

import "fmt"

// MarshalText encodes the policy as its name ("quarantine"), so that JSON
// output carries the words of the text output.
func (p Policy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText reads a policy's name back; any other text is an error.
func (p *Policy) UnmarshalText(text []byte) error {
	for _, q := range [...]Policy{Quarantine, DestroyWhenEmpty} {
		if string(text) == q.String() {
			*p = q
			return nil
		}
	}
	return fmt.Errorf("unknown policy %q, want %s or %s", text, Quarantine, DestroyWhenEmpty)
}
