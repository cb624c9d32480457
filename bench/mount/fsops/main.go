// Command fsops times metadata operations for bench/mount.sh: it creates
// N empty files in a directory, or stats them, and prints the seconds and
// the operations per second. A program rather than a shell loop, so what
// is timed is the file system, not process start-up.
//
//	fsops create DIR N   creates DIR/f00000 .. (O_CREAT|O_EXCL, then close)
//	fsops stat DIR N     lstat of each of them, in the same order
//	fsops queued CACHE   prints how many commits the mount caches under
//	                     CACHE ($CAIRN_HOME/mountcache) hold queued
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"cairn.dev/cairn/internal/journal"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "queued" {
		dirs, _ := filepath.Glob(filepath.Join(os.Args[2], "*", "queue"))
		n := 0
		for _, d := range dirs {
			recs, err := journal.Read(d)
			if err != nil {
				fmt.Fprintln(os.Stderr, "fsops:", err)
				os.Exit(1)
			}
			old, _ := filepath.Glob(filepath.Join(d, "*.json")) // an older cairn's
			n += len(recs) + len(old)
		}
		fmt.Println(n)
		return
	}
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: fsops create|stat DIR N")
		os.Exit(2)
	}
	op, dir := os.Args[1], os.Args[2]
	n, err := strconv.Atoi(os.Args[3])
	if err != nil || n <= 0 {
		fmt.Fprintln(os.Stderr, "fsops: N must be a positive number")
		os.Exit(2)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = filepath.Join(dir, fmt.Sprintf("f%05d", i))
	}
	start := time.Now()
	for _, p := range names {
		switch op {
		case "create":
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err == nil {
				err = f.Close()
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "fsops:", err)
				os.Exit(1)
			}
		case "stat":
			fi, err := os.Lstat(p)
			if err != nil {
				fmt.Fprintln(os.Stderr, "fsops:", err)
				os.Exit(1)
			}
			if fi.Size() != 0 || !fi.Mode().IsRegular() {
				fmt.Fprintf(os.Stderr, "fsops: %s: size %d mode %v, want an empty file\n", p, fi.Size(), fi.Mode())
				os.Exit(1)
			}
		default:
			fmt.Fprintln(os.Stderr, "fsops: unknown operation", op)
			os.Exit(2)
		}
	}
	s := time.Since(start).Seconds()
	fmt.Printf("%.6f %.1f\n", s, float64(n)/s)
}
