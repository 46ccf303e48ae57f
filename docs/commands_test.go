package docs_test

// This file keeps every command the documents show runnable. It reads the
// shell blocks of README.md, docs/*.md and loadtest/README.md and, for each
// command in them:
//
//   - `rain <command> ...`, `go run ./cmd/rain <command> ...` and `docker
//     compose run SERVICE <command> ...`: the command is one of rain's (`rain
//     -h`), each --flag is one `rain <command> -h` lists, and each RAIN_*
//     variable named beside it is one the command reads;
//   - `scripts/NAME.sh ...`: the script exists and is executable, and
//     bench.sh's sections are ones it has.
//
// rain is built from the tree and asked, so the documents cannot drift from
// the flags. A synopsis may go on over lines: a line that ends with `\`, or
// an indented line that starts with a flag (`--x`, `[--x`, `| --x`), goes on
// the command before it.

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the repository's root, seen from docs/ where the test runs.
const root = ".."

// shellDocs are the documents whose shell blocks are checked, from root.
func shellDocs(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md", "loadtest/README.md"}
	for _, d := range docs {
		rel, _ := filepath.Rel(root, d)
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

// command is one command of a shell block: its text, continuation lines
// joined, and the line each part of it is on.
type command struct {
	file  string
	text  string
	lines []int    // the line of each part
	parts []string // the text of each part
}

// lineOf is the line of the first part of c that holds word (a flag, a
// variable), or c's first line.
func (c command) lineOf(word string) int {
	if word != "" {
		re := regexp.MustCompile(`(^|[^A-Za-z0-9_-])` + regexp.QuoteMeta(word) + `($|[^A-Za-z0-9_-])`)
		for i, p := range c.parts {
			if re.MatchString(p) {
				return c.lines[i]
			}
		}
	}
	return c.lines[0]
}

// shellBlocks reads the commands of the fenced blocks of a Markdown file
// that hold shell: no info string, or sh, bash, shell, console.
func shellBlocks(t *testing.T, file string) []command {
	t.Helper()
	f, err := os.Open(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []command
	in, shell := false, false
	var cur *command
	continues := false // the last line ended with a backslash
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if fence, ok := strings.CutPrefix(strings.TrimSpace(line), "```"); ok {
			if in {
				in, cur = false, nil
				continue
			}
			in = true
			shell = slices.Contains([]string{"", "sh", "bash", "shell", "console"}, strings.TrimSpace(fence))
			continue
		}
		if !in || !shell {
			continue
		}
		text := stripComment(line)
		trimmed := strings.TrimSpace(text)
		indented := strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t")
		goesOn := continues || (cur != nil && indented && continuationRE.MatchString(trimmed))
		continues = strings.HasSuffix(trimmed, `\`)
		trimmed = strings.TrimSuffix(trimmed, `\`)
		switch {
		case goesOn && cur != nil:
			cur.text += " " + strings.TrimSpace(trimmed)
			cur.lines = append(cur.lines, n)
			cur.parts = append(cur.parts, trimmed)
		case trimmed == "":
			cur = nil
		default:
			out = append(out, command{file: file, text: strings.TrimSpace(trimmed), lines: []int{n}, parts: []string{trimmed}})
			cur = &out[len(out)-1]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// continuationRE is an indented line of a synopsis that goes on the
// command before it: it starts with a flag, maybe in brackets or after |.
var continuationRE = regexp.MustCompile(`^(\[|\|\s*)?--?[A-Za-z]`)

// stripComment cuts a shell comment (# at the start or after a blank,
// outside quotes) off a line.
func stripComment(line string) string {
	var quote rune
	prev := ' '
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (prev == ' ' || prev == '\t'):
			return line[:i]
		}
		prev = r
	}
	return line
}

var (
	assignRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
	flagRE    = regexp.MustCompile(`(?:^|[\s\[(|,])(--?[A-Za-z][A-Za-z0-9-]*)`)
	envRE     = regexp.MustCompile(`\bRAIN_[A-Z0-9_]+\b`)
	scriptRE  = regexp.MustCompile(`^(?:\./)?(scripts/[A-Za-z0-9_.-]+\.sh)$`)
	helpRE    = regexp.MustCompile(`^\s+-{1,2}([A-Za-z0-9][A-Za-z0-9-]*)\b`)
	helpEnvRE = regexp.MustCompile(`\[(RAIN_[A-Z0-9_]+)\]`)
	subRE     = regexp.MustCompile(`^  ([a-z]+)\s{2,}`)
	sectionRE = regexp.MustCompile(`\(have: ([a-z ]+)\)`)
)

// rainCLI is what the built rain says about itself.
type rainCLI struct {
	t     *testing.T
	bin   string
	subs  []string                     // rain -h's commands
	flags map[string]map[string]string // command -> flag -> env var ("" if none)
}

// topFlags are what rain takes in place of a command.
var topFlags = []string{"h", "help", "version"}

func buildRain(t *testing.T) *rainCLI {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rain")
	build := exec.Command("go", "build", "-o", bin, "./cmd/rain")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/rain: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "-h").Output()
	if err != nil {
		t.Fatalf("rain -h: %v", err)
	}
	cli := &rainCLI{t: t, bin: bin, flags: map[string]map[string]string{}}
	commands := false
	for line := range strings.SplitSeq(string(out), "\n") {
		switch {
		case line == "commands:":
			commands = true
		case line == "":
			commands = false
		case commands:
			if m := subRE.FindStringSubmatch(line); m != nil {
				cli.subs = append(cli.subs, m[1])
			}
		}
	}
	if len(cli.subs) == 0 {
		t.Fatalf("rain -h lists no commands:\n%s", out)
	}
	return cli
}

// flagsOf is what `rain sub -h` lists: each flag and its variable.
func (c *rainCLI) flagsOf(sub string) map[string]string {
	if f, ok := c.flags[sub]; ok {
		return f
	}
	cmd := exec.Command(c.bin, sub, "-h")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		c.t.Fatalf("rain %s -h: %v\n%s", sub, err, stderr.String())
	}
	f := map[string]string{}
	last := ""
	for line := range strings.SplitSeq(stderr.String(), "\n") {
		if m := helpRE.FindStringSubmatch(line); m != nil {
			last = m[1]
			f[last] = ""
		}
		if m := helpEnvRE.FindStringSubmatch(line); m != nil && last != "" {
			f[last] = m[1]
		}
	}
	c.flags[sub] = f
	return f
}

// problem is what is wrong with a command, and the word of it that is.
type problem struct {
	word, msg string
}

// check checks one command of a document and says what is wrong with it.
func (c *rainCLI) check(args []string) []problem {
	words := args
	for len(words) > 0 && assignRE.MatchString(words[0]) {
		words = words[1:] // VAR=value before the command
	}
	switch {
	case len(words) == 0:
		return nil
	case words[0] == "rain":
		return c.checkRain(words[1:])
	case len(words) > 2 && words[0] == "go" && words[1] == "run" && strings.TrimSuffix(words[2], "/") == "./cmd/rain":
		return c.checkRain(words[3:])
	case len(words) > 3 && words[0] == "docker" && words[1] == "compose" && words[2] == "run":
		rest := words[3:]
		for len(rest) > 0 && strings.HasPrefix(rest[0], "-") {
			rest = rest[1:] // --rm, ...
		}
		if len(rest) > 1 && slices.Contains(c.subs, rest[1]) {
			return c.checkRain(rest[1:]) // a rain service, run with a command
		}
		return nil
	}
	if m := scriptRE.FindStringSubmatch(words[0]); m != nil {
		return checkScript(m[1], words[1:])
	}
	return nil
}

// checkRain checks rain's arguments: a command and its flags.
func (c *rainCLI) checkRain(args []string) []problem {
	if len(args) == 0 {
		return []problem{{"", "rain without a command"}}
	}
	sub := args[0]
	if strings.HasPrefix(sub, "-") {
		if !slices.Contains(topFlags, strings.TrimLeft(sub, "-")) {
			return []problem{{sub, fmt.Sprintf("rain %s: rain takes no such flag before a command (it takes %v)", sub, topFlags)}}
		}
		return nil
	}
	if !slices.Contains(c.subs, sub) {
		return []problem{{sub, fmt.Sprintf("rain %s: no such command (rain -h lists %v)", sub, c.subs)}}
	}
	if sub == "version" {
		return nil
	}
	flags := c.flagsOf(sub)
	rest := strings.Join(args[1:], " ")
	var problems []problem
	for _, m := range flagRE.FindAllStringSubmatch(rest, -1) {
		name, _, _ := strings.Cut(strings.TrimLeft(m[1], "-"), "=")
		if _, ok := flags[name]; !ok && name != "h" && name != "help" {
			problems = append(problems, problem{m[1], fmt.Sprintf("rain %s has no flag %s (rain %s -h lists %v)", sub, m[1], sub, keys(flags))})
		}
	}
	for _, env := range envRE.FindAllString(rest, -1) {
		if !slices.ContainsFunc(keys(flags), func(f string) bool { return flags[f] == env }) {
			problems = append(problems, problem{env, fmt.Sprintf("rain %s reads no variable %s", sub, env)})
		}
	}
	return problems
}

// checkScript checks that a script exists and is executable, and that the
// sections given to scripts/bench.sh are ones it has.
func checkScript(path string, args []string) []problem {
	fi, err := os.Stat(filepath.Join(root, path))
	switch {
	case err != nil:
		return []problem{{path, err.Error()}}
	case fi.Mode()&0o111 == 0:
		return []problem{{path, path + " is not executable (chmod +x, and commit it so)"}}
	case path != "scripts/bench.sh":
		return nil
	}
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		return []problem{{path, err.Error()}}
	}
	m := sectionRE.FindSubmatch(b)
	if m == nil {
		return []problem{{path, "scripts/bench.sh no longer names its sections as (have: ...): teach docs/commands_test.go where they are"}}
	}
	sections := strings.Fields(string(m[1]))
	var problems []problem
	for _, a := range args {
		if !slices.Contains(sections, a) {
			problems = append(problems, problem{a, fmt.Sprintf("scripts/bench.sh has no section %q (it has %v)", a, sections)})
		}
	}
	return problems
}

func keys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestCommandsRun: every rain command, flag and variable, and every script,
// the documents' shell blocks show exists (see the top of this file).
func TestCommandsRun(t *testing.T) {
	cli := buildRain(t)
	checked := 0
	for _, file := range shellDocs(t) {
		for _, c := range shellBlocks(t, file) {
			for _, p := range cli.check(strings.Fields(c.text)) {
				t.Errorf("%s:%d: %s\n\tin: %s", c.file, c.lineOf(p.word), p.msg, c.text)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no commands found in the documents' shell blocks")
	}
}

// TestCommandCheck: the checker finds what it must, on lines made up for it.
func TestCommandCheck(t *testing.T) {
	cli := buildRain(t)
	for _, tc := range []struct {
		line string
		bad  bool
	}{
		{"go run ./cmd/rain serve --listen 127.0.0.1:8080", false},
		{"rain serve --listen :8080 [RAIN_LISTEN]", false},
		{"rain --version", false},
		{"rain settle --redis ... --ledger FILE [--claim-after 30s] [RAIN_SETTLE_GROUP]", false},
		{"docker compose run --rm rain-1 audit --pool cny2027", false},
		{"DURATION=30m scripts/soak.sh", false},
		{"BEFORE=REV scripts/bench.sh versus", false},
		{"rain serve --no-such-flag", true},
		{"rain serve [--no-such-flag N]", true},
		{"rain audit --pool P [RAIN_LISTEN]", true}, // serve's variable, not audit's
		{"rain nosuchcommand --pool P", true},
		{"docker compose run --rm rain-1 audit --listen :1", true},
		{"rain --no-such-flag", true},
		{"scripts/nosuch.sh", true},
		{"scripts/bench.sh nosuchsection", true},
	} {
		got := cli.check(strings.Fields(tc.line))
		if (len(got) > 0) != tc.bad {
			t.Errorf("check(%q) = %q, want a problem: %v", tc.line, got, tc.bad)
		}
	}
}
