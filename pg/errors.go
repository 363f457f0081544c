package keylanepg

import (
	"errors"
	"fmt"

	"github.com/keylane/keylane"
)

// StaleFenceError is Apply's error when a newer fence than the group's has
// committed for its partition: the group's owner was deposed (paused past
// its lease, cut off), and nothing of the group was written. It wraps
// keylane.ErrStaleFence, so errors.Is(err, keylane.ErrStaleFence) holds,
// as for a stale write to keylane's own state.
type StaleFenceError struct {
	Namespace string
	Partition int
	// Fence is the group's fence; Committed the newer one found.
	Fence, Committed uint64
}

func (e *StaleFenceError) Error() string {
	return fmt.Sprintf("keylanepg: stale fence %d for %s partition %d: fence %d has committed (the owner was deposed; nothing written)",
		e.Fence, e.Namespace, e.Partition, e.Committed)
}

// Unwrap returns keylane.ErrStaleFence.
func (e *StaleFenceError) Unwrap() error { return keylane.ErrStaleFence }

// ErrSchema is wrapped by every SchemaError.
var ErrSchema = errors.New("keylanepg: keylane's tables are missing or unusable")

// ErrPrivilege is wrapped by a SchemaError whose cause is a missing right
// of the connected role.
var ErrPrivilege = errors.New("keylanepg: missing privilege")

// SchemaError is Ensure's error for keylane's tables: one could not be
// created, has not the expected columns, or the connected role lacks a
// right it needs on it. It wraps ErrSchema, ErrPrivilege when a right is
// missing, and the database's own error when there is one.
type SchemaError struct {
	// Table is keylane_fences or keylane_outcomes.
	Table string
	// Role is the connected role (current_user).
	Role string
	// Problem says what is wrong, and Fix what would cure it.
	Problem, Fix string
	// Privilege tells that a missing right is the cause.
	Privilege bool
	// Err is the database's error, if any.
	Err error
}

func (e *SchemaError) Error() string {
	s := fmt.Sprintf("keylanepg: table %s: %s", e.Table, e.Problem)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	if e.Fix != "" {
		s += " (" + e.Fix + ")"
	}
	return s
}

// Unwrap returns ErrSchema, ErrPrivilege if a right is missing, and the
// database's error.
func (e *SchemaError) Unwrap() []error {
	errs := []error{ErrSchema}
	if e.Privilege {
		errs = append(errs, ErrPrivilege)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}
