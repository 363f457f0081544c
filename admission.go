package keylane

import (
	"github.com/keylane/keylane/internal/core"
)

// KeyBacklogFullError is ErrKeyBacklogFull for one key: Key, the resource
// key whose backlog is full, and Cap, the namespace's MaxKeyBacklog (how
// many jobs of one key the jobs stream holds at most: waiting, running or
// retrying). Submit and Call refuse a job over it with one (see
// internal/client's admission).
type KeyBacklogFullError = core.KeyBacklogFullError
