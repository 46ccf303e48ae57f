package main

// This file binds flags to environment variables and builds the one logger
// of a command.

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"regexp"
)

// flags is a FlagSet whose flags also read an environment variable.
type flags struct {
	*flag.FlagSet
	env      map[string]string // flag name -> env var
	fromArgs map[string]bool   // flags the command line set (after parse)
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

// parse sets flags from args, then from the environment those args left
// unset: a flag on the command line wins over its variable.
func (f *flags) parse(args []string, getenv func(string) string) error {
	if err := f.Parse(args); err != nil {
		return asUsage(err)
	}
	if f.NArg() > 0 {
		return usagef("unexpected arguments: %v", f.Args())
	}
	f.fromArgs = map[string]bool{}
	f.Visit(func(fl *flag.Flag) { f.fromArgs[fl.Name] = true })
	for name, env := range f.env {
		if v := getenv(env); v != "" && !f.fromArgs[name] {
			if err := f.Set(name, v); err != nil {
				return usagef("%s=%q: %w", env, v, err)
			}
		}
	}
	return nil
}

// secretArgs says which of the flags named carry a secret on the command
// line, where every user of the host can read it (ps, /proc/PID/cmdline):
// one warning for each, naming the flag and its variable, never the value.
// A flag carries a secret when it is always one (always), or when its
// value holds a password (user:password@ in a URL or a shard, password= in
// a connection string).
func (f *flags) secretArgs(always []string, valued ...string) []string {
	var out []string
	warn := func(name string) {
		out = append(out, fmt.Sprintf("--%s on the command line: every user of the host can read it (ps, /proc/PID/cmdline); give it in %s, or a file", name, f.env[name]))
	}
	for _, name := range always {
		if f.fromArgs[name] && f.Lookup(name).Value.String() != "" {
			warn(name)
		}
	}
	for _, name := range valued {
		if fl := f.Lookup(name); fl != nil && f.fromArgs[name] && holdsSecret(fl.Value.String()) {
			warn(name)
		}
	}
	return out
}

// warnSecretArgs writes secretArgs's warnings for the shards and the
// database (the secrets an operator tool takes) to stderr, the tools
// having no logger.
func (f *flags) warnSecretArgs(stderr io.Writer) {
	for _, w := range f.secretArgs(nil, "redis", "postgres") {
		fmt.Fprintln(stderr, "rain: warning:", w)
	}
}

// credentialsRE finds credentials in a URL, a shard spec or a connection
// string: "user:password@" after a scheme or sentinel/, or "password=".
var credentialsRE = regexp.MustCompile(`(?i)(://|sentinel/)[^@/,]*:[^@,]*@|\bpassword=`)

// holdsSecret says whether a flag's value holds credentials (credentialsRE).
func holdsSecret(v string) bool { return credentialsRE.MatchString(v) }

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
