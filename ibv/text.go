package ibv

// MarshalText methods write each enum as its String, so that JSON output
// (the CLI's -j) carries the name libibverbs's *_str functions print and
// callers need no string mirror of their structs. They never fail.

// MarshalText encodes the state as its name ("ERR").
func (s QPState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// MarshalText encodes the type as its name ("RC").
func (t QPType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// MarshalText encodes the status as its name ("WR_FLUSH_ERR").
func (s WCStatus) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// MarshalText encodes the event type as its name ("LAST_WQE_REACHED").
func (e EventType) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// MarshalText encodes the port state as its name ("ACTIVE").
func (s PortState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// MarshalText encodes the link layer as its name ("Ethernet").
func (l LinkLayer) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// MarshalText encodes the node type as its name.
func (n NodeType) MarshalText() ([]byte, error) { return []byte(n.String()), nil }

// MarshalText encodes the transport as its name.
func (t TransportType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// MarshalText encodes the GID type as its name.
func (t GIDType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }
