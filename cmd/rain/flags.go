package main

// This file binds flags to environment variables and builds the one logger
// of a command.

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// flags is a FlagSet whose flags also read an environment variable.
type flags struct {
	*flag.FlagSet
	env      map[string]string // flag name -> env var
	fromArgs map[string]bool   // flags the command line set (after parse)
	renamed  map[string]string // old flag name -> the flag it was renamed to (see rename)
	oldUsed  []string          // the old names the command line or the environment gave (after parse)
}

func newFlags(name string, stderr io.Writer) *flags {
	fs := flag.NewFlagSet("rain "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &flags{FlagSet: fs, env: map[string]string{}, renamed: map[string]string{}}
	fs.Usage = f.usage
	return f
}

// bindEnv notes that flag name also reads env var; help says so.
func (f *flags) bindEnv(name, env string) {
	f.env[name] = env
	fl := f.Lookup(name)
	fl.Usage += " [" + env + "]"
}

// rename keeps old, the name that flag to had before a release renamed it,
// working for that release: old sets the same value, reads its old
// variable oldEnv (none when ""), is left out of the help but for one line
// that names it, and each use of it is warned of (deprecations). Giving
// both names at the same level, both on the command line or both in the
// environment, is a usage error; otherwise the command line wins over the
// environment as for any flag (an old flag over a new variable, a new flag
// over an old variable). Call it after to's bindEnv.
func (f *flags) rename(old, oldEnv, to string) {
	f.Var(f.Lookup(to).Value, old, "the old name of --"+to)
	if oldEnv != "" {
		f.bindEnv(old, oldEnv)
	}
	f.renamed[old] = to
}

// other is the other name of a renamed flag (its old name for the new one,
// its new name for the old one), or "".
func (f *flags) other(name string) string {
	if n, ok := f.renamed[name]; ok {
		return n
	}
	for old, n := range f.renamed {
		if n == name {
			return old
		}
	}
	return ""
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
	if err := f.checkRenamed(getenv); err != nil {
		return err
	}
	for name, env := range f.env {
		if v := getenv(env); v != "" && !f.fromArgs[name] && !f.fromArgs[f.other(name)] {
			if err := f.Set(name, v); err != nil {
				return usagef("%s=%q: %w", env, v, err)
			}
		}
	}
	return nil
}

// checkRenamed refuses a renamed flag given by both its names at one
// level, and notes the old names given (oldUsed), in the order of the help.
func (f *flags) checkRenamed(getenv func(string) string) error {
	f.oldUsed = nil
	for _, old := range slices.Sorted(maps.Keys(f.renamed)) {
		to := f.renamed[old]
		if f.fromArgs[old] && f.fromArgs[to] {
			return usagef("--%s and --%s both given: --%s is the old name of --%s; give --%s only", old, to, old, to, to)
		}
		oldEnv, newEnv := f.env[old], f.env[to]
		oldSet := oldEnv != "" && getenv(oldEnv) != ""
		if oldSet && newEnv != "" && getenv(newEnv) != "" {
			return usagef("%s and %s both set: %s is the old name of %s; set %s only", oldEnv, newEnv, oldEnv, newEnv, newEnv)
		}
		if f.fromArgs[old] {
			f.oldUsed = append(f.oldUsed, "--"+old)
		}
		if oldSet {
			f.oldUsed = append(f.oldUsed, oldEnv)
		}
	}
	return nil
}

// deprecations says, one line each, which old names the command was given
// and what replaces them: the command logs them once, at start.
func (f *flags) deprecations() []string {
	var out []string
	for _, used := range f.oldUsed {
		if name, ok := strings.CutPrefix(used, "--"); ok {
			out = append(out, fmt.Sprintf("--%s is deprecated and goes in the next release: use --%s", name, f.renamed[name]))
			continue
		}
		for old, env := range f.env {
			if env == used {
				out = append(out, fmt.Sprintf("%s is deprecated and goes in the next release: use %s", env, f.env[f.renamed[old]]))
			}
		}
	}
	return out
}

// usage prints the flags as flag.PrintDefaults does, less the old names of
// renamed flags, which one line at the end names.
func (f *flags) usage() {
	out := f.Output()
	fmt.Fprintf(out, "Usage of %s:\n", f.Name())
	shown := flag.NewFlagSet(f.Name(), flag.ContinueOnError)
	shown.SetOutput(out)
	f.VisitAll(func(fl *flag.Flag) {
		if _, old := f.renamed[fl.Name]; !old {
			shown.Var(fl.Value, fl.Name, fl.Usage)
			shown.Lookup(fl.Name).DefValue = fl.DefValue
		}
	})
	shown.PrintDefaults()
	if len(f.renamed) == 0 {
		return
	}
	var olds []string
	for _, old := range slices.Sorted(maps.Keys(f.renamed)) {
		o := "-" + old + " (now -" + f.renamed[old]
		if env := f.env[old]; env != "" {
			o += ", " + env + " now " + f.env[f.renamed[old]]
		}
		olds = append(olds, o+")")
	}
	fmt.Fprintf(out, "Old names still taken for this release, each with a warning: %s\n", strings.Join(olds, ", "))
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
// string: "user:password@" after a scheme, sentinel/, cluster/ (or their
// +tls/ forms), or "password=".
var credentialsRE = regexp.MustCompile(`(?i)(://|(sentinel|cluster)(\+tls)?/)[^@/,]*:[^@,]*@|\bpassword=`)

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
