// Command fusert measures what one FUSE round trip costs on this machine,
// with a file system that does nothing: the floor under every request a
// mount makes (bench/fuse-rt.sh).
//
//	fusert serve DIR       mount a null file system with one file, f, on DIR
//	                       (no attribute or entry caching) until SIGTERM
//	fusert stat FILE N     fstat FILE N times; print the mean µs per call
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

type root struct{ fs.Inode }

func (r *root) OnAdd(ctx context.Context) {
	f := r.NewPersistentInode(ctx, &fs.MemRegularFile{Data: []byte("x\n"), Attr: fuse.Attr{Mode: 0o644}}, fs.StableAttr{Ino: 2})
	r.AddChild("f", f, false)
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: fusert serve DIR | fusert stat FILE N")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		zero := time.Duration(0)
		srv, err := fs.Mount(os.Args[2], &root{}, &fs.Options{EntryTimeout: &zero, AttrTimeout: &zero})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, os.Interrupt)
		go func() { <-c; srv.Unmount() }()
		srv.Wait()
	case "stat":
		n, err := strconv.Atoi(os.Args[3])
		if err != nil || n <= 0 {
			fmt.Fprintln(os.Stderr, "N must be a positive number")
			os.Exit(2)
		}
		fd, err := syscall.Open(os.Args[2], syscall.O_RDONLY, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		var st syscall.Stat_t
		t0 := time.Now()
		for range n {
			if err := syscall.Fstat(fd, &st); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		fmt.Printf("%.1f\n", float64(time.Since(t0).Microseconds())/float64(n))
	default:
		fmt.Fprintln(os.Stderr, "usage: fusert serve DIR | fusert stat FILE N")
		os.Exit(2)
	}
}
