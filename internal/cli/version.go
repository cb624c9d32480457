package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is the release the binary was built as, set at link time:
// go build -ldflags "-X cairn.dev/cairn/internal/cli.version=v1.2.0".
// Without it, VersionString reports what the Go toolchain recorded (the
// module version and the VCS revision of the build).
var version string

// VersionString is what 'cairn --version' prints after "cairn ".
func VersionString() string {
	v := version
	info, ok := debug.ReadBuildInfo()
	if v == "" && ok && info.Main.Version != "" {
		v = info.Main.Version
	}
	if v == "" {
		v = "(devel)"
	}
	if ok {
		var rev, at, modified string
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
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
			v += fmt.Sprintf(" (%s %s%s)", rev, at, modified)
		}
	}
	return v + ", " + runtime.Version()
}
