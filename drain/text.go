package drain

import "fmt"

// MarshalText methods write each enum the CLI prints as its String, so
// that JSON output (-j) carries the same words as the text output and
// callers need no string mirror of their structs. They never fail. The
// enums JSON is read back into (Policy, Outcome) have UnmarshalText too.

// MarshalText encodes the policy as its name ("quarantine").
func (p Policy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// MarshalText encodes the queue as its name ("send", "recv", "unknown").
func (q Queue) MarshalText() ([]byte, error) { return []byte(q.String()), nil }

// MarshalText encodes the outcome as its name ("safe").
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// MarshalText encodes the proof as its description ("receive drain WR").
func (p Proof) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// MarshalText encodes what was missing as its description.
func (m Missing) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

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

// UnmarshalText reads an outcome's name back; any other text is an error.
func (o *Outcome) UnmarshalText(text []byte) error {
	for i, n := range outcomeNames {
		if string(text) == n {
			*o = Outcome(i)
			return nil
		}
	}
	return fmt.Errorf("unknown outcome %q, want one of %q", text, outcomeNames)
}
