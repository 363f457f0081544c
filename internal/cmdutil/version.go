package cmdutil

import (
	"fmt"
	"runtime"

	"github.com/keylane/keylane/internal/buildinfo"
)

// Version is the version of the running command: the linker's version
// if one was set (-X github.com/keylane/keylane/internal/buildinfo.version=…),
// else keylane's module version from the build information ("(devel)" in
// a checkout, v1.2.0 after go install …@v1.2.0), with the VCS revision and
// "modified" when the go command recorded them.
func Version() string { return buildinfo.Read().String() }

// VersionLine is what a command's --version prints: its name, Version
// and the Go release it was built with.
func VersionLine(name string) string {
	return fmt.Sprintf("%s %s %s", name, Version(), runtime.Version())
}
