// Package cmdutil is what keylane's commands share about flags and exit
// statuses: -h is no failure (status 0), a usage error is status 2 (after
// the flag package has said which flag, or with a *UsageError's message),
// anything else status 1.
package cmdutil

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// ExitError is an exit that has already been explained: 0 after -h
// printed the usage, 2 after a usage error.
type ExitError int

func (e ExitError) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// Parse parses a command's flags, its messages going to errOut. Flags may
// come before, between and after the positional arguments (keylane dead
// show 1 --json), which fs.Args then holds in their order; after "--"
// everything is positional. -h prints the flags and is no failure: it
// returns ExitError(0), which ends the command at once with status 0. A
// bad flag returns ExitError(2), the flag package having said which flag
// and printed the flags.
func Parse(fs *flag.FlagSet, args []string, errOut io.Writer) error {
	fs.SetOutput(errOut)
	var positional []string
	for {
		err := fs.Parse(args)
		switch {
		case errors.Is(err, flag.ErrHelp):
			return ExitError(0)
		case err != nil:
			return ExitError(2)
		}
		rest := fs.Args()
		if consumed := args[:len(args)-len(rest)]; len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			positional = append(positional, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		// The flag package stops at the first positional argument: keep
		// it and go on with what follows.
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	// Flags parsed so far stay set; this only leaves fs.Args as the
	// positional arguments.
	_ = fs.Parse(append([]string{"--"}, positional...))
	return nil
}

// Exit ends the process as err says: an ExitError's status (its
// explanation printed already), or the error on stderr after the
// command's name and Code's status (2 for a *UsageError, else 1). A nil
// err returns.
func Exit(name string, err error) {
	var exit ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(int(exit))
	case err != nil:
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(Code(err))
	}
}

// Namespace is the default of every command's --namespace: the
// environment's KEYLANE_NAMESPACE, as the worker reads it, else "keylane".
// An operator who exported it for the workers acts on the same namespace.
func Namespace() string {
	if ns := os.Getenv("KEYLANE_NAMESPACE"); ns != "" {
		return ns
	}
	return "keylane"
}

// UsageError is a command line refused for what it says rather than for
// its syntax (a missing argument, flags that do not go together, a value
// out of range): Exit prints it and ends with status 2, as for a bad
// flag. Nothing was done.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a *UsageError with the message fmt.Errorf makes.
func Usagef(format string, args ...any) error {
	return &UsageError{fmt.Errorf(format, args...)}
}

// Code is the exit status of a command that returned err: 0 for nil, an
// ExitError's own, 2 for a *UsageError, else 1.
func Code(err error) int {
	var exit ExitError
	var usage *UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return int(exit)
	case errors.As(err, &usage):
		return 2
	}
	return 1
}
