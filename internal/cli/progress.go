package cli

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"

	"cairn.dev/cairn/internal/apitypes"
)

// progress shows files, bytes, MB/s and bytes saved by dedup on a terminal.
// Without a terminal it does nothing. Safe for concurrent use.
type progress struct {
	bar        *progressbar.ProgressBar
	w          io.Writer
	totalFiles int64
	files      atomic.Int64
	saved      atomic.Int64
	mu         sync.Mutex
	lastDesc   time.Time
	done       bool
}

func newProgress(w io.Writer, show bool, totalFiles, totalBytes int64) *progress {
	p := &progress{w: w, totalFiles: totalFiles}
	if !show {
		return p
	}
	p.bar = progressbar.NewOptions64(totalBytes,
		progressbar.OptionSetWriter(w),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionUseIECUnits(true),
		progressbar.OptionSetWidth(24),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetDescription(p.desc()),
	)
	return p
}

func (p *progress) desc() string {
	return fmt.Sprintf("%d/%d files, dedup saved %s", p.files.Load(), p.totalFiles, apitypes.IBytes(p.saved.Load()))
}

// add records files finished, bytes read and bytes saved by dedup.
func (p *progress) add(files, bytes, saved int64) {
	p.files.Add(files)
	p.saved.Add(saved)
	if p.bar == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	if time.Since(p.lastDesc) > 100*time.Millisecond {
		p.bar.Describe(p.desc())
		p.lastDesc = time.Now()
	}
	if bytes > 0 {
		_ = p.bar.Add64(bytes)
	}
}

// println prints a message above the bar.
func (p *progress) println(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil && !p.done {
		_ = p.bar.Clear()
	}
	fmt.Fprintln(p.w, msg)
}

func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil && !p.done {
		_ = p.bar.Finish()
		_ = p.bar.Clear()
	}
	p.done = true
}

// countBar counts items (versions checked, marked) once their total is
// known. Without a terminal it does nothing. Safe for concurrent use.
type countBar struct {
	w    io.Writer
	show bool
	desc string
	mu   sync.Mutex
	bar  *progressbar.ProgressBar
}

func newCountBar(w io.Writer, show bool, desc string) *countBar {
	return &countBar{w: w, show: show, desc: desc}
}

func (c *countBar) set(done, total int) {
	if !c.show {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bar == nil {
		c.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(c.w), progressbar.OptionSetDescription(c.desc),
			progressbar.OptionShowCount(), progressbar.OptionSetWidth(24), progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(), progressbar.OptionSetPredictTime(true))
	}
	_ = c.bar.Set(done)
}

func (c *countBar) finish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bar != nil {
		_ = c.bar.Finish()
		_ = c.bar.Clear()
	}
}
