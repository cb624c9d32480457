package cairn

import (
	"errors"
	"strings"
)

// Kind classifies an error so callers (and, at the edge, exit codes, errno
// values and HTTP statuses) can act on it without parsing messages.
type Kind uint8

// The kinds of error. Keep the numbering stable: it crosses the network.
const (
	Other       Kind = iota // unclassified
	NotFound                // the object, file, volume or key does not exist
	Exist                   // the thing being created already exists
	Invalid                 // bad input: malformed path, argument or request
	Corrupt                 // stored data fails verification (hash, AEAD tag, format)
	Permission              // wrong passphrase, missing key, refused by policy
	IO                      // the medium or network failed
	Unavailable             // a service (etcd, a store) cannot be reached now
	Conflict                // a concurrent change won (CAS failed, lock held)
	IsDir                   // a directory where a file was expected
	NotDir                  // a file where a directory was expected
	NotEmpty                // a non-empty directory where an empty one was required
	Canceled                // the context was canceled or timed out
)

var kindNames = [...]string{
	Other: "error", NotFound: "not found", Exist: "already exists", Invalid: "invalid",
	Corrupt: "corrupt", Permission: "permission denied", IO: "I/O error",
	Unavailable: "unavailable", Conflict: "conflict", IsDir: "is a directory",
	NotDir: "not a directory", NotEmpty: "directory not empty", Canceled: "canceled",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "error"
}

// Error is cairn's error: what was being done (Op), to what (Path: a file path,
// an object ID, a volume name), what kind of failure it was, and the cause.
type Error struct {
	Op   string
	Kind Kind
	Path string
	Err  error
}

// Sentinels for errors.Is: errors.Is(err, cairn.ErrNotFound) matches any
// *Error whose Kind is NotFound, at any depth of wrapping.
var (
	ErrNotFound    = &Error{Kind: NotFound}
	ErrExist       = &Error{Kind: Exist}
	ErrInvalid     = &Error{Kind: Invalid}
	ErrCorrupt     = &Error{Kind: Corrupt}
	ErrPermission  = &Error{Kind: Permission}
	ErrIO          = &Error{Kind: IO}
	ErrUnavailable = &Error{Kind: Unavailable}
	ErrConflict    = &Error{Kind: Conflict}
	ErrIsDir       = &Error{Kind: IsDir}
	ErrNotDir      = &Error{Kind: NotDir}
	ErrNotEmpty    = &Error{Kind: NotEmpty}
	ErrCanceled    = &Error{Kind: Canceled}
)

// E builds an *Error. err may be nil.
func E(op string, kind Kind, path string, err error) error {
	return &Error{Op: op, Kind: kind, Path: path, Err: err}
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Op != "" {
		b.WriteString(e.Op)
	}
	if e.Path != "" {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		b.WriteString(e.Path)
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	var inner *Error
	if e.Err != nil && errors.As(e.Err, &inner) {
		// The cause already names its own kind.
		b.WriteString(e.Err.Error())
		return b.String()
	}
	b.WriteString(e.Kind.String())
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Is matches sentinels by Kind: a target *Error with only Kind set matches any
// *Error of that Kind.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	return t.Op == "" && t.Path == "" && t.Err == nil && t.Kind == e.Kind && e.Kind != Other
}

// KindOf returns the Kind of the outermost *Error in err's chain whose Kind is
// not Other, or Other.
func KindOf(err error) Kind {
	for err != nil {
		if e, ok := err.(*Error); ok && e.Kind != Other {
			return e.Kind
		}
		err = errors.Unwrap(err)
	}
	return Other
}
