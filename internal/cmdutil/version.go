package cmdutil

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is the release a build names, set by the linker:
//
//	go build -ldflags "-X github.com/keylane/keylane/internal/cmdutil.version=v1.2.0" ./cmd/keylane
//
// Empty, Version reads the module version and VCS revision the go
// command recorded in the binary.
var version string

// Version is the version of the running command: the linker's version
// if one was set, else the main module's version from the build
// information ("(devel)" in a checkout, v1.2.0 after go install
// …@v1.2.0), with the VCS revision and "modified" when the go command
// recorded them.
func Version() string {
	v := version
	info, ok := debug.ReadBuildInfo()
	if v == "" && ok {
		v = info.Main.Version
	}
	if v == "" {
		v = "(unknown)"
	}
	if !ok {
		return v
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		v += " (" + rev + modified + ")"
	}
	return v
}

// VersionLine is what a command's --version prints: its name, Version
// and the Go release it was built with.
func VersionLine(name string) string {
	return fmt.Sprintf("%s %s %s", name, Version(), runtime.Version())
}
