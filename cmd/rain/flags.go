package main

// This file binds flags to environment variables and builds the one logger
// of a command.

import (
	"flag"
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
				return usagef("%s=%q: %w", env, v, err)
			}
		}
	}
	if err := f.Parse(args); err != nil {
		return asUsage(err)
	}
	if f.NArg() > 0 {
		return usagef("unexpected arguments: %v", f.Args())
	}
	return nil
}

// logOptions are the logging flags every long-running command takes.
type logOptions struct {
	Level  string // --log-level
	Format string // --log-format: text or json
}

// logFlags adds --log-level and --log-format (and their env vars) to f.
func (f *flags) logFlags() *logOptions {
	o := &logOptions{}
	f.StringVar(&o.Level, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.Format, "log-format", "text", `"text" (key=value lines) or "json" (one JSON object per line)`)
	f.bindEnv("log-level", "RAIN_LOG_LEVEL")
	f.bindEnv("log-format", "RAIN_LOG_FORMAT")
	return o
}

// newLogger is the one logger of a command.
func (o *logOptions) newLogger(w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(o.Level)); err != nil {
		return nil, usagef("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: l}
	var h slog.Handler
	switch o.Format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, usagef("--log-format %q: want text or json", o.Format)
	}
	return slog.New(h), nil
}
