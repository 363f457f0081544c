package sqlfile

import (
	"fmt"
	"strconv"
	"strings"
)

// Builtin parameters: the job's own ID and key, bound whatever the
// payload holds. A payload field cannot shadow them: field names have no
// dot.
const (
	paramJobID  = "job.id"
	paramJobKey = "job.key"
)

var builtins = []string{paramJobID, paramJobKey}

// bindNames rewrites src's named parameters (:name, :job.id, :job.key)
// into PostgreSQL's positional ones ($1, $2, ...), one number per name
// however often it appears, and returns the rewritten SQL with the names
// in their numbers' order. It skips what is not SQL to rewrite: string
// literals ('…', E'…' with backslash escapes), quoted identifiers ("…"),
// dollar-quoted strings ($tag$…$tag$), comments (-- and nested /* */) and
// casts (::). A positional parameter ($1) in the file is refused: the
// file names its parameters.
func bindNames(src string) (sql string, names []string, err error) {
	var out strings.Builder
	num := map[string]int{}
	i := 0
	for i < len(src) {
		c := src[i]
		switch {
		case c == '\'':
			end, err := quoted(src, i, '\'', i > 0 && (src[i-1] == 'E' || src[i-1] == 'e') && (i < 2 || !isIdent(src[i-2])))
			if err != nil {
				return "", nil, err
			}
			out.WriteString(src[i:end])
			i = end
		case c == '"':
			end, err := quoted(src, i, '"', false)
			if err != nil {
				return "", nil, err
			}
			out.WriteString(src[i:end])
			i = end
		case c == '-' && strings.HasPrefix(src[i:], "--"):
			end := strings.IndexByte(src[i:], '\n')
			if end < 0 {
				end = len(src) - i
			}
			out.WriteString(src[i : i+end])
			i += end
		case c == '/' && strings.HasPrefix(src[i:], "/*"):
			end, err := blockComment(src, i)
			if err != nil {
				return "", nil, err
			}
			out.WriteString(src[i:end])
			i = end
		case c == '$' && (i == 0 || !isIdent(src[i-1])):
			j := i + 1
			for j < len(src) && src[j] >= '0' && src[j] <= '9' {
				j++
			}
			if j > i+1 {
				return "", nil, fmt.Errorf("positional parameter %s: name it instead (:name, bound to the payload's field of that name)", src[i:j])
			}
			end, ok := dollarQuoted(src, i)
			if !ok {
				out.WriteByte(c)
				i++
				continue
			}
			out.WriteString(src[i:end])
			i = end
		case c == ':' && strings.HasPrefix(src[i:], "::"):
			out.WriteString("::")
			i += 2
		case c == ':' && i+1 < len(src) && isIdentStart(src[i+1]):
			j := i + 1
			for j < len(src) && isIdent(src[j]) {
				j++
			}
			// job.id and job.key: a dot and a second word.
			if src[i+1:j] == "job" && j < len(src) && src[j] == '.' {
				k := j + 1
				for k < len(src) && isIdent(src[k]) {
					k++
				}
				j = k
			}
			name := src[i+1 : j]
			n, ok := num[name]
			if !ok {
				names = append(names, name)
				n = len(names)
				num[name] = n
			}
			out.WriteString("$" + strconv.Itoa(n))
			i = j
		default:
			out.WriteByte(c)
			i++
		}
	}
	return out.String(), names, nil
}

// quoted returns the end of the literal or identifier quoted by q that
// starts at src[start]; a doubled quote is one character of it, and with
// backslashes a backslash escapes the next byte.
func quoted(src string, start int, q byte, backslashes bool) (int, error) {
	for i := start + 1; i < len(src); i++ {
		switch {
		case backslashes && src[i] == '\\':
			i++
		case src[i] == q:
			if i+1 < len(src) && src[i+1] == q {
				i++
				continue
			}
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated %c at byte %d", q, start)
}

// blockComment returns the end of the comment that starts at src[start];
// PostgreSQL's block comments nest.
func blockComment(src string, start int) (int, error) {
	depth := 0
	for i := start; i < len(src)-1; i++ {
		switch {
		case src[i] == '/' && src[i+1] == '*':
			depth++
			i++
		case src[i] == '*' && src[i+1] == '/':
			depth--
			i++
			if depth == 0 {
				return i + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("unterminated /* comment at byte %d", start)
}

// dollarQuoted returns the end of the dollar-quoted string ($$…$$ or
// $tag$…$tag$) that starts at src[start], and false when no tag starts
// there.
func dollarQuoted(src string, start int) (int, bool) {
	j := start + 1
	for j < len(src) && src[j] != '$' {
		if !isIdent(src[j]) {
			return 0, false
		}
		j++
	}
	if j >= len(src) {
		return 0, false
	}
	tag := src[start : j+1]
	end := strings.Index(src[j+1:], tag)
	if end < 0 {
		return len(src), true // unterminated: the server says so at prepare
	}
	return j + 1 + end + len(tag), true
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80
}

func isIdent(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

// txWords are the statements that end or reshape the group's
// transaction, which keylanepg owns: refused in the file at start, as
// keylanepg refuses them at run time.
var txWords = []string{"begin", "start", "commit", "end", "rollback", "abort", "savepoint", "release", "prepare"}

// firstWord returns sql's first keyword, lower-cased, past blanks and
// comments.
func firstWord(sql string) string {
	for {
		sql = strings.TrimLeft(sql, " \t\r\n\f(")
		switch {
		case strings.HasPrefix(sql, "--"):
			end := strings.IndexByte(sql, '\n')
			if end < 0 {
				return ""
			}
			sql = sql[end:]
		case strings.HasPrefix(sql, "/*"):
			end, err := blockComment(sql, 0)
			if err != nil {
				return ""
			}
			sql = sql[end:]
		default:
			i := 0
			for i < len(sql) && isIdent(sql[i]) {
				i++
			}
			return strings.ToLower(sql[:i])
		}
	}
}
