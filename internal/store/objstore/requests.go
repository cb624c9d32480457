package objstore

import (
	"fmt"
	"sync/atomic"
)

// Class is a class of request, as cloud providers bill them.
type Class int

// The request classes.
const (
	PUT Class = iota
	GET
	HEAD
	LIST
	DELETE
	numClasses
)

var classNames = [numClasses]string{"PUT", "GET", "HEAD", "LIST", "DELETE"}

func (c Class) String() string {
	if c >= 0 && c < numClasses {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Counter counts requests by class. The zero value is ready; it is safe for
// concurrent use.
type Counter struct {
	n [numClasses]atomic.Int64
}

// Add counts one request of class c.
func (n *Counter) Add(c Class) {
	if c >= 0 && c < numClasses {
		n.n[c].Add(1)
	}
}

// Snapshot returns the counts so far.
func (n *Counter) Snapshot() Requests {
	return Requests{
		Put:    n.n[PUT].Load(),
		Get:    n.n[GET].Load(),
		Head:   n.n[HEAD].Load(),
		List:   n.n[LIST].Load(),
		Delete: n.n[DELETE].Load(),
	}
}

// Requests counts the requests a store has sent, by class.
type Requests struct {
	Put, Get, Head, List, Delete int64
}

// Total is the number of requests of every class.
func (r Requests) Total() int64 { return r.Put + r.Get + r.Head + r.List + r.Delete }

// Sub returns r minus an earlier snapshot: the requests sent in between.
func (r Requests) Sub(earlier Requests) Requests {
	return Requests{
		Put:    r.Put - earlier.Put,
		Get:    r.Get - earlier.Get,
		Head:   r.Head - earlier.Head,
		List:   r.List - earlier.List,
		Delete: r.Delete - earlier.Delete,
	}
}

// Map returns the counts keyed by class name (PUT, GET, HEAD, LIST, DELETE).
func (r Requests) Map() map[string]int64 {
	return map[string]int64{
		PUT.String(): r.Put, GET.String(): r.Get, HEAD.String(): r.Head,
		LIST.String(): r.List, DELETE.String(): r.Delete,
	}
}

func (r Requests) String() string {
	return fmt.Sprintf("PUT %d GET %d HEAD %d LIST %d DELETE %d", r.Put, r.Get, r.Head, r.List, r.Delete)
}
