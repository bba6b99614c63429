// Package cmdkit holds what the commands (throttled, capacityd) share:
// the exit convention and the logger their flags choose.
package cmdkit

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
)

// Main calls run with the command line and exits: 0 when it returns nil,
// 2 otherwise, after printing "name: error" to stderr (not for
// flag.ErrHelp: the flag package has printed the usage).
func Main(name string, run func(args []string, stdout, stderr io.Writer) error) {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, name+":", err)
		}
		os.Exit(2)
	}
}

// Logger returns a logger writing to w from level ("debug", "info",
// "warn" or "error") up, in JSON when asJSON is set, text otherwise.
func Logger(w io.Writer, level string, asJSON bool) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: l}
	if asJSON {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}
