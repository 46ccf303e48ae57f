package docs_test

// This file keeps the documents' links whole: every relative link of
// README.md and docs/*.md names a file that exists and, with #anchor, a
// heading of it; and every pointer into docs/ that code, scripts and
// manifests carry (docs/architecture.md#the-spill-protocol in a comment, a
// runbook_url) names a heading that exists. Anchors are made as GitHub makes
// them from a heading.

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

var (
	headingRE = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
	mdLinkRE  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	pointerRE = regexp.MustCompile(`\bdocs/([a-z0-9_-]+\.md)#([A-Za-z0-9_-]+)`)
	fenceRE   = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")
)

// anchor is the anchor GitHub gives a heading: lower case, its letters,
// digits, blanks, - and _ kept, the rest dropped, blanks made -.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the anchors of a Markdown file's headings (a repeated heading
// gets -1, -2, ... as on GitHub).
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := fenceRE.ReplaceAllString(string(b), "") // a # line in a code block is no heading
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range headingRE.FindAllStringSubmatch(text, -1) {
		a := anchor(m[1])
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestDocLinks: the relative links of the documents lead somewhere.
func TestDocLinks(t *testing.T) {
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files := append([]string{filepath.Join(root, "README.md")}, docs...)
	cache := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := cache[path]; ok {
			return a
		}
		cache[path] = anchors(t, path)
		return cache[path]
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := fenceRE.ReplaceAllString(string(b), "")
		for _, m := range mdLinkRE.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			full := file
			if path != "" {
				full = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(full); err != nil {
					t.Errorf("%s: link %s: %v", rel(file), target, err)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(full, ".md") && !anchorsOf(full)[frag] {
				t.Errorf("%s: link %s: %s has no heading #%s", rel(file), target, rel(full), frag)
			}
		}
	}
}

// TestDocPointers: every docs/NAME.md#anchor the repository's code,
// scripts and manifests name is a heading of that document.
func TestDocPointers(t *testing.T) {
	found := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "artifacts", "bench-out":
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".lua", ".sh", ".yml", ".yaml", ".md", ".json":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range pointerRE.FindAllStringSubmatch(string(b), -1) {
			found++
			doc := filepath.Join(root, "docs", m[1])
			if _, err := os.Stat(doc); err != nil {
				t.Errorf("%s: points at docs/%s#%s: %v", rel(path), m[1], m[2], err)
				continue
			}
			if !anchors(t, doc)[m[2]] {
				t.Errorf("%s: points at docs/%s#%s: no such heading there", rel(path), m[1], m[2])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatal("no pointer into docs/ found: the walk is broken")
	}
}

// rel is path from the repository's root, for messages.
func rel(path string) string {
	r, err := filepath.Rel(root, path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(r)
}
