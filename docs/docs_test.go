package docs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
)

// notYet lists the pages other work items write, which the README already
// links. A link to one of them passes while it is missing; once it exists,
// it is checked like any other. Remove an entry when its page lands.
var notYet = map[string]bool{}

// pages are the README and every page under docs/, as paths relative to
// the repository's root (the test runs in docs/).
func pages(t *testing.T) []string {
	t.Helper()
	found, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, f := range found {
		out = append(out, "docs/"+f)
	}
	return out
}

func read(t *testing.T, page string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", page))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestLinks: every relative link of the README and of docs/*.md names a
// file or directory that exists, and an anchor one of its headings.
func TestLinks(t *testing.T) {
	for _, page := range pages(t) {
		for _, err := range checkLinks(page, read(t, page)) {
			t.Errorf("%s: %v", page, err)
		}
	}
}

// TestLinkCheckCatchesBrokenLinks: the link check refuses a missing file
// and a missing anchor, and tolerates a missing page only if notYet names it.
func TestLinkCheckCatchesBrokenLinks(t *testing.T) {
	text := "[a](docs/no-such-page.md) [b](docs/cluster.md#no-such-heading) [c](#nowhere) [d](docs/oncall.md) [e](docs/cluster.md#several-jobs-streams---stream-shards)\n\n## Here\n"
	errs := checkLinks("README.md", text)
	var said []string
	for _, err := range errs {
		said = append(said, err.Error())
	}
	all := strings.Join(said, "\n")
	for _, want := range []string{"docs/no-such-page.md", "#no-such-heading", "#nowhere"} {
		if !strings.Contains(all, want) {
			t.Errorf("the link check did not refuse %s; it said:\n%s", want, all)
		}
	}
	if len(errs) != 3 {
		t.Errorf("want 3 refusals (the allow-listed and the good link pass), got %d:\n%s", len(errs), all)
	}
}

var linkRE = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)

// checkLinks checks the relative links of page (a path from the root),
// outside fenced code blocks and code spans.
func checkLinks(page, text string) []error {
	var errs []error
	for _, line := range prose(text) {
		for _, m := range linkRE.FindAllStringSubmatch(stripSpans(line), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(page), file)))
			}
			if strings.HasPrefix(path, "../") {
				errs = append(errs, fmt.Errorf("link %s leaves the repository", target))
				continue
			}
			b, err := os.ReadFile(filepath.Join("..", path))
			if err != nil {
				if _, statErr := os.Stat(filepath.Join("..", path)); statErr == nil {
					continue // a directory
				}
				if notYet[path] {
					continue
				}
				errs = append(errs, fmt.Errorf("link %s: %s does not exist", target, path))
				continue
			}
			if path == page && file == "" {
				b = []byte(text)
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !anchors(string(b))[anchor] {
				errs = append(errs, fmt.Errorf("link %s: %s has no heading with anchor #%s", target, path, anchor))
			}
		}
	}
	return errs
}

// anchors are the GitHub anchors of a page's headings.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(text) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimLeft(line, "#")
		if !strings.HasPrefix(title, " ") {
			continue
		}
		var slug strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(title)) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				slug.WriteRune(r)
			case r == ' ':
				slug.WriteRune('-')
			}
		}
		s := slug.String()
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// prose is the page's lines outside fenced code blocks.
func prose(text string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

var spanRE = regexp.MustCompile("`[^`]*`")

func stripSpans(line string) string { return spanRE.ReplaceAllString(line, "``") }

// TestCommandsInDocs: every invocation of keylane's commands that the
// README and docs/*.md show (in sh code blocks, and in code spans that
// begin with "go run ", "keylane ", "submit " or "worker ") names subcommands that exist and only flags that
// the command defines, as the built command's -h says.
func TestCommandsInDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the commands: skipped in -short")
	}
	h := newHelper(t)
	n := 0
	for _, page := range pages(t) {
		for _, inv := range invocations(read(t, page)) {
			n++
			if err := h.check(inv); err != nil {
				t.Errorf("%s: %s\n\t%v", page, inv.line, err)
			}
		}
	}
	if n < 20 {
		t.Errorf("found only %d command lines in the README and docs/: the extraction is broken", n)
	}
	t.Logf("%d command lines checked", n)
}

// TestCommandCheckCatchesInventedFlags: a flag no command defines, or a
// subcommand that does not exist, is refused, in a block and in a span.
func TestCommandCheckCatchesInventedFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the commands: skipped in -short")
	}
	h := newHelper(t)
	text := "Run `go run ./cmd/submit sale --buyers 8 --no-such-flag 3`, then `keylane dead list --limitt 3`.\n\n" +
		"```sh\n" +
		"go run ./cmd/worker --metrics 127.0.0.1:9464 --invented\n" +
		"NATS_URL=nats://x go run ./cmd/keylane dead list --limit 3 --json # fine\n" +
		"go run ./cmd/keylane deadd list\n" +
		"cd bench && go run . --runs 3 --not-a-bench-flag\n" +
		"go run ./cmd/nope\n" +
		"```\n"
	invs := invocations(text)
	if len(invs) != 7 {
		t.Fatalf("want 7 invocations, got %d: %v", len(invs), invs)
	}
	want := []string{"--no-such-flag", "--limitt", "--invented", "", `"deadd"`, "--not-a-bench-flag", "./cmd/nope"}
	for i, inv := range invs {
		err := h.check(inv)
		switch {
		case want[i] == "" && err != nil:
			t.Errorf("%s: refused: %v", inv.line, err)
		case want[i] != "" && (err == nil || !strings.Contains(err.Error(), want[i])):
			t.Errorf("%s: want an error naming %s, got %v", inv.line, want[i], err)
		}
	}
}

// invocation is one shell command line of a page that runs one of
// keylane's commands: the program and its arguments.
type invocation struct {
	line string
	prog string // as in programs, or "unknown ..."
	args []string
}

func (i invocation) String() string { return i.line }

// programs maps how a page runs a command (the directory go run runs in,
// and its package) to the name the helper builds it under.
var programs = map[[2]string]string{
	{".", "./cmd/keylane"}:     "keylane",
	{".", "./cmd/submit"}:      "submit",
	{".", "./cmd/worker"}:      "worker",
	{".", "./e2e/testworker"}:  "testworker",
	{"pg", "./cmd/sale"}:       "pgsale",
	{"pg", "./cmd/keylane-pg"}: "keylane-pg",
	{"bench", "."}:             "bench",
}

// invocations finds the command lines of a page: each line of a fenced
// sh/bash/shell/console block (continuations joined) or any fenced line
// that starts with "go run", and each code span that starts with "go run",
// "keylane", "submit" or "worker" and a space.
func invocations(text string) []invocation {
	var lines []string
	fenced, shell := false, false
	var cont string
	var para []string
	flush := func() {
		joined := strings.Join(para, " ")
		for _, m := range spanRE.FindAllString(joined, -1) {
			s := strings.Trim(m, "`")
			for _, p := range []string{"go run ", "keylane ", "submit ", "worker "} {
				if strings.HasPrefix(s, p) {
					lines = append(lines, s)
					break
				}
			}
		}
		para = nil
	}
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			if !fenced {
				flush()
				lang := strings.TrimPrefix(trimmed, "```")
				shell = lang == "sh" || lang == "bash" || lang == "shell" || lang == "console"
			}
			fenced = !fenced
			cont = ""
			continue
		}
		if !fenced {
			if trimmed == "" {
				flush()
			} else {
				para = append(para, line)
			}
			continue
		}
		if !shell && !strings.HasPrefix(trimmed, "go run ") {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cont += strings.TrimSuffix(trimmed, "\\") + " "
			continue
		}
		lines = append(lines, cont+trimmed)
		cont = ""
	}
	flush()
	var out []invocation
	for _, line := range lines {
		dir := "."
		for _, words := range segments(line) {
			for len(words) > 0 && (isAssignment(words[0]) || words[0] == "do" || words[0] == "then" || words[0] == "time" || words[0] == "exec") {
				words = words[1:]
			}
			if len(words) == 0 {
				continue
			}
			if words[0] == "cd" && len(words) == 2 {
				dir = filepath.Clean(filepath.Join(dir, words[1]))
				continue
			}
			if inv, ok := invocationOf(line, dir, words); ok {
				out = append(out, inv)
			}
		}
	}
	return out
}

func isAssignment(w string) bool {
	name, _, ok := strings.Cut(w, "=")
	return ok && name != "" && !strings.HasPrefix(name, "-") && strings.ToUpper(name) == name
}

// invocationOf recognises "go run [-C dir] PKG ARGS", "./cmd/X ARGS" and
// "keylane|submit|worker|keylane-pg ARGS".
func invocationOf(line, dir string, words []string) (invocation, bool) {
	switch words[0] {
	case "keylane", "submit", "worker":
		return invocation{line: line, prog: words[0], args: words[1:]}, true
	case "./cmd/keylane", "./cmd/submit", "./cmd/worker":
		return invocation{line: line, prog: strings.TrimPrefix(words[0], "./cmd/"), args: words[1:]}, true
	case "keylane-pg", "./keylane-pg": // the pg module's deployable worker, built
		return invocation{line: line, prog: "keylane-pg", args: words[1:]}, true
	case "go":
	default:
		return invocation{}, false
	}
	if len(words) < 3 || words[1] != "run" {
		return invocation{}, false
	}
	i := 2
	for i < len(words) && strings.HasPrefix(words[i], "-") {
		if words[i] == "-C" && i+1 < len(words) {
			dir = filepath.Clean(filepath.Join(dir, words[i+1]))
			i++
		}
		i++
	}
	if i >= len(words) {
		return invocation{}, false
	}
	prog, ok := programs[[2]string{dir, words[i]}]
	if !ok || prog == "" {
		prog = "unknown go run package " + words[i] + " in " + dir
	}
	return invocation{line: line, prog: prog, args: words[i+1:]}, true
}

// segments splits a shell line into its simple commands (at |, ||, &, &&,
// ;, parentheses) and words (quotes removed, a # comment dropped).
func segments(line string) [][]string {
	var out [][]string
	var words []string
	var w strings.Builder
	inWord := false
	endWord := func() {
		if inWord {
			words = append(words, w.String())
			w.Reset()
			inWord = false
		}
	}
	endSeg := func() {
		endWord()
		if len(words) > 0 {
			out = append(out, words)
		}
		words = nil
	}
	rs := []rune(line)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case r == '\'' || r == '"':
			inWord = true
			j := i + 1
			for j < len(rs) && rs[j] != r {
				if r == '"' && rs[j] == '\\' && j+1 < len(rs) {
					j++
				}
				w.WriteRune(rs[j])
				j++
			}
			i = j
		case r == '$' && i+1 < len(rs) && rs[i+1] == '(':
			inWord = true
			depth := 0
			for ; i < len(rs); i++ {
				w.WriteRune(rs[i])
				if rs[i] == '(' {
					depth++
				} else if rs[i] == ')' {
					depth--
					if depth == 0 {
						break
					}
				}
			}
		case r == '#' && !inWord:
			endSeg()
			return out
		case r == '|' || r == '&' || r == ';' || r == '(' || r == ')':
			endSeg()
		case unicode.IsSpace(r):
			endWord()
		case r == '\\' && i+1 < len(rs):
			inWord = true
			i++
			w.WriteRune(rs[i])
		default:
			inWord = true
			w.WriteRune(r)
		}
	}
	endSeg()
	return out
}

// helper builds the commands once and reads their usage.
type helper struct {
	dir  string
	mu   sync.Mutex
	help map[string]usage
}

// usage is what a command's -h says: its subcommands and its flags.
type usage struct {
	subs  map[string]bool
	flags map[string]bool
	text  string
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// newHelper builds keylane's commands (the root module's, the pg module's
// sale and keylane-pg, and the bench) into a directory shared by the tests of this run.
func newHelper(t *testing.T) *helper {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "keylane-docs-")
		if buildErr != nil {
			return
		}
		for _, b := range []struct{ module, out, pkg string }{
			{"..", "", "./cmd/keylane"},
			{"..", "", "./cmd/submit"},
			{"..", "", "./cmd/worker"},
			{"..", "testworker", "./e2e/testworker"},
			{"../pg", "pgsale", "./cmd/sale"},
			{"../pg", "keylane-pg", "./cmd/keylane-pg"},
			{"../bench", "bench", "."},
		} {
			out := filepath.Join(buildDir, b.out)
			if b.out == "" {
				out = buildDir + string(filepath.Separator)
			}
			cmd := exec.Command("go", "build", "-o", out, b.pkg)
			cmd.Dir = b.module
			if msg, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s in %s: %v\n%s", b.pkg, b.module, err, msg)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return &helper{dir: buildDir, help: map[string]usage{}}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var (
	subRE  = regexp.MustCompile(`^  ([a-z][a-z0-9-]*)(\s|$)`)
	flagRE = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9_.-]*)`)
)

// usageOf runs "prog path... -h" and reads its subcommands and flags.
func (h *helper) usageOf(prog string, path []string) (usage, error) {
	key := prog + " " + strings.Join(path, " ")
	h.mu.Lock()
	defer h.mu.Unlock()
	if u, ok := h.help[key]; ok {
		return u, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(h.dir, prog), append(append([]string{}, path...), "-h")...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "NATS_URL=nats://127.0.0.1:1") // nothing to reach, should -h try
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return usage{}, fmt.Errorf("%s -h: %v", key, err)
	}
	u := usage{subs: map[string]bool{}, flags: map[string]bool{"h": true, "help": true}, text: out.String()}
	for _, line := range strings.Split(out.String(), "\n") {
		if m := flagRE.FindStringSubmatch(line); m != nil {
			u.flags[m[1]] = true
		} else if m := subRE.FindStringSubmatch(line); m != nil {
			u.subs[m[1]] = true
		}
	}
	if len(u.subs) == 0 && len(u.flags) == 2 {
		return usage{}, fmt.Errorf("%s -h printed no flags and no commands:\n%s", key, out.String())
	}
	h.help[key] = u
	return u, nil
}

// check walks an invocation's subcommands as the command's usage lists
// them, then checks each flag against the deepest one's flags.
func (h *helper) check(inv invocation) error {
	if strings.HasPrefix(inv.prog, "unknown") {
		return errors.New(inv.prog)
	}
	var path []string
	u, err := h.usageOf(inv.prog, nil)
	if err != nil {
		return err
	}
	var flags []string
	walking := true
	for _, a := range inv.args {
		switch {
		case a == "…" || a == "...":
			continue
		case strings.HasPrefix(a, "-") && len(a) > 1:
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			flags = append(flags, name)
		case walking && len(u.subs) > 0:
			if !u.subs[a] {
				return fmt.Errorf("%s %s: unknown subcommand %q (it has %s)", inv.prog, strings.Join(path, " "), a, sorted(u.subs))
			}
			path = append(path, a)
			if u, err = h.usageOf(inv.prog, path); err != nil {
				return err
			}
		default:
			walking = false // an argument: what follows is not a subcommand
		}
	}
	for _, f := range flags {
		if !u.flags[f] {
			return fmt.Errorf("%s %s: flag --%s is not defined (-h lists %s)", inv.prog, strings.Join(path, " "), f, sorted(u.flags))
		}
	}
	return nil
}

func sorted(set map[string]bool) string {
	var s []string
	for k := range set {
		s = append(s, k)
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}
