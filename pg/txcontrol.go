package keylanepg

import (
	"fmt"
	"strings"

	"github.com/keylane/keylane"
)

// txWords are the first words of the statements that would end or
// reshape keylanepg's transaction from inside a job: commit or roll it
// back (COMMIT, END, ROLLBACK, ABORT, and PREPARE TRANSACTION, matched
// with its second word), begin another (BEGIN, START), or move its
// savepoints (SAVEPOINT, RELEASE; a Handler nests its own with tx.Begin,
// which keylanepg sends).
var txWords = []string{"abort", "begin", "commit", "end", "release", "rollback", "savepoint", "start"}

// refuseTxControl returns a permanent error wrapping ErrTxOwned when a
// statement of sql ends or reshapes the transaction: such a statement is
// never sent. It reads every statement of sql (a string without
// arguments may hold several), past blanks and comments, and skips quoted
// text.
func refuseTxControl(jobID, sql string) error {
	for _, stmt := range statements(sql) {
		first, rest := word(stmt)
		kw := ""
		if strings.EqualFold(first, "prepare") {
			if second, _ := word(rest); strings.EqualFold(second, "transaction") {
				kw = "PREPARE TRANSACTION"
			}
		} else {
			for _, w := range txWords {
				if strings.EqualFold(first, w) {
					kw = strings.ToUpper(w)
				}
			}
		}
		if kw != "" {
			return keylane.Permanent(fmt.Errorf("%w: job %s sent %s", ErrTxOwned, jobID, kw))
		}
	}
	return nil
}

// word splits s, past leading blanks, into its first word (letters,
// digits, '_' and bytes of multi-byte runes) and the rest.
func word(s string) (string, string) {
	s = strings.TrimLeft(s, " \t\n\r\f")
	i := 0
	for i < len(s) && isWordByte(lower(s[i])) {
		i++
	}
	return s[:i], s[i:]
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func isWordByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c >= 0x80
}

// statements splits sql at its semicolons outside quotes ('…', "…",
// $tag$…$tag$) and comments, and returns each statement from its first
// word on (blanks and comments before it skipped).
func statements(sql string) []string {
	var out []string
	start := -1 // the current statement's first word, if seen
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == '-' && strings.HasPrefix(sql[i:], "--"):
			if j := strings.IndexByte(sql[i:], '\n'); j >= 0 {
				i += j + 1
			} else {
				i = len(sql)
			}
			continue
		case c == '/' && strings.HasPrefix(sql[i:], "/*"):
			if j := strings.Index(sql[i+2:], "*/"); j >= 0 {
				i += j + 4
			} else {
				i = len(sql)
			}
			continue
		case c == ';':
			if start >= 0 {
				out = append(out, sql[start:i])
			}
			start = -1
			i++
			continue
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			i++
			continue
		}
		if start < 0 {
			start = i
		}
		switch {
		case c == '\'' || c == '"':
			j := strings.IndexByte(sql[i+1:], c)
			if j < 0 {
				return append(out, sql[start:])
			}
			i += j + 2
		case c == '$':
			tag := sql[i:]
			if k := strings.IndexByte(tag[1:], '$'); k >= 0 && isTag(tag[1:k+1]) {
				tag = tag[:k+2]
				j := strings.Index(sql[i+len(tag):], tag)
				if j < 0 {
					return append(out, sql[start:])
				}
				i += len(tag) + j + len(tag)
			} else {
				i++
			}
		default:
			i++
		}
	}
	if start >= 0 {
		out = append(out, sql[start:])
	}
	return out
}

// isTag tells whether s can be a dollar quote's tag (empty, or a word).
func isTag(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := lower(s[i]); !(c == '_' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
