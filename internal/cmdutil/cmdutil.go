// Package cmdutil is what keylane's commands share about flags and exit
// statuses: -h is no failure (status 0), a usage error is status 2 after
// the flag package has said which flag, anything else status 1.
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

// Parse parses a command's flags, its messages going to errOut. -h prints
// the flags and is no failure: it returns ExitError(0), which ends the
// command at once with status 0. A bad flag returns ExitError(2), the flag
// package having said which flag and printed the flags.
func Parse(fs *flag.FlagSet, args []string, errOut io.Writer) error {
	fs.SetOutput(errOut)
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		return ExitError(0)
	}
	return ExitError(2)
}

// Exit ends the process as err says: an ExitError's status, or the error
// on stderr after the command's name and status 1. A nil err returns.
func Exit(name string, err error) {
	var exit ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(int(exit))
	case err != nil:
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
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
