package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"rain/loadtest/rainload/internal/report"
	"rain/loadtest/rainload/internal/timeline"
)

// runReport is `rainload report`: one HTML page of charts from -timeline files,
// each argument NAME=FILE or FILE (named after the file).
func runReport(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("rainload report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "write the HTML page to `FILE` (required)")
	title := fs.String("title", "rainload report", "the page's `title`")
	notes := fs.String("notes", "", "show the text of `FILE` under the title, preformatted")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("report: -o is required")
	}
	if fs.NArg() == 0 {
		return errors.New("report: give at least one timeline file ([NAME=]FILE)")
	}
	p := report.Page{Title: *title, Generated: time.Now()}
	if *notes != "" {
		b, err := os.ReadFile(*notes)
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		p.Notes = strings.TrimRight(string(b), "\n")
	}
	for _, arg := range fs.Args() {
		name, path, ok := strings.Cut(arg, "=")
		if !ok {
			path = arg
			name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
		}
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		ss, err := timeline.Read(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("report: %s: %w", path, err)
		}
		p.Runs = append(p.Runs, report.Run{Name: name, Samples: ss})
	}
	f, err := os.Create(*out)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := report.Write(f, p); err != nil {
		f.Close()
		return fmt.Errorf("report: %w", err)
	}
	return f.Close()
}
