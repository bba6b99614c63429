// Package cmdkit holds what the commands (throttled, capacityd) share:
// the exit convention, the flags of the configuration file and the
// logger, and the logger those flags choose.
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

// Flags are the flags every command has: the configuration file, and the
// logger's level and format.
type Flags struct {
	ConfigPath  string // -config
	PrintConfig bool   // -print-config
	LogLevel    string // -log-level
	LogJSON     bool   // -log-json
}

// FlagSet returns the flag set of command name, printing to stderr, with
// f's flags in it.
func (f *Flags) FlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.ConfigPath, "config", "", "JSON configuration file (default: the embedded one, see -print-config)")
	fs.BoolVar(&f.PrintConfig, "print-config", false, "print the effective configuration as JSON and exit")
	fs.StringVar(&f.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&f.LogJSON, "log-json", false, "log JSON instead of text")
	return fs
}

// Parse parses args with fs; arguments beyond the flags are an error.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return nil
}

// Logger returns the logger f's flags choose, writing to w.
func (f *Flags) Logger(w io.Writer) (*slog.Logger, error) {
	return Logger(w, f.LogLevel, f.LogJSON)
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
