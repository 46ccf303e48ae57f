package main

// This file binds flags to environment variables and builds the one logger
// of a command.

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// flags is a FlagSet whose flags also read an environment variable.
type flags struct {
	*flag.FlagSet
	env map[string]string // flag name -> env var
}

func newFlags(name string, stderr io.Writer) *flags {
	fs := flag.NewFlagSet("rain "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &flags{FlagSet: fs, env: map[string]string{}}
}

// bindEnv notes that flag name also reads env var; help says so.
func (f *flags) bindEnv(name, env string) {
	f.env[name] = env
	fl := f.Lookup(name)
	fl.Usage += " [" + env + "]"
}

// parse sets flags from the environment, then from args, which win.
func (f *flags) parse(args []string, getenv func(string) string) error {
	for name, env := range f.env {
		if v := getenv(env); v != "" {
			if err := f.Set(name, v); err != nil {
				return fmt.Errorf("%s=%q: %w", env, v, err)
			}
		}
	}
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", f.Args())
	}
	return nil
}

// newLogger is the one logger of a command, at level (--log-level).
func newLogger(level string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
