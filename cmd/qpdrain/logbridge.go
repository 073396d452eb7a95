package main

import (
	"context"
	"log/slog"
	"maps"

	"github.com/sirupsen/logrus"
)

// logrusHandler is the slog.Handler the CLI hands the libraries (drain,
// ipoibcm, scenario, metrics): it writes their records through the CLI's
// logrus logger, so that --log-level and --log-format govern them as they
// govern the CLI's own lines, in the same format on the same writer.
type logrusHandler struct {
	log    *logrus.Logger
	fields logrus.Fields // of WithAttrs, keys grouped already
	group  string        // of WithGroup: "" or the groups' names, each followed by "."
}

// libLog is the logger the CLI hands the libraries: its own, through slog.
func (g *globalOptions) libLog() *slog.Logger {
	return slog.New(&logrusHandler{log: g.log})
}

// Enabled says whether log writes records of level l, so that a library
// builds none it would not.
func (h *logrusHandler) Enabled(_ context.Context, l slog.Level) bool {
	return h.log.IsLevelEnabled(logrusLevel(l))
}

// Handle writes r as one logrus entry: its attributes as fields, its time
// as the entry's.
func (h *logrusHandler) Handle(_ context.Context, r slog.Record) error {
	fields := make(logrus.Fields, len(h.fields)+r.NumAttrs())
	maps.Copy(fields, h.fields)
	r.Attrs(func(a slog.Attr) bool {
		addField(fields, h.group, a)
		return true
	})
	entry := h.log.WithFields(fields)
	if !r.Time.IsZero() {
		entry = entry.WithTime(r.Time)
	}
	entry.Log(logrusLevel(r.Level), r.Message)
	return nil
}

// WithAttrs is h with as added to every entry.
func (h *logrusHandler) WithAttrs(as []slog.Attr) slog.Handler {
	fields := maps.Clone(h.fields)
	if fields == nil {
		fields = make(logrus.Fields, len(as))
	}
	for _, a := range as {
		addField(fields, h.group, a)
	}
	return &logrusHandler{log: h.log, fields: fields, group: h.group}
}

// WithGroup is h with the keys of later attributes under name, as
// "name.key" (slog.TextHandler's way).
func (h *logrusHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &logrusHandler{log: h.log, fields: h.fields, group: h.group + name + "."}
}

// addField adds a to fields under prefix, a group's attributes each under
// the group's key; empty attributes are left out, as slog.Handler asks.
func addField(fields logrus.Fields, prefix string, a slog.Attr) {
	a.Value = a.Value.Resolve()
	switch {
	case a.Equal(slog.Attr{}):
	case a.Value.Kind() == slog.KindGroup:
		if a.Key != "" {
			prefix += a.Key + "."
		}
		for _, g := range a.Value.Group() {
			addField(fields, prefix, g)
		}
	default:
		fields[prefix+a.Key] = a.Value.Any()
	}
}

// logrusLevel is the logrus level of slog level l: each of slog's levels
// its namesake, and below debug trace.
func logrusLevel(l slog.Level) logrus.Level {
	switch {
	case l >= slog.LevelError:
		return logrus.ErrorLevel
	case l >= slog.LevelWarn:
		return logrus.WarnLevel
	case l >= slog.LevelInfo:
		return logrus.InfoLevel
	case l >= slog.LevelDebug:
		return logrus.DebugLevel
	default:
		return logrus.TraceLevel
	}
}
