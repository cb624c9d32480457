package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/metrics"
)

// metricsFlag adds --metrics ADDR to a long-running command (doc/metrics.md).
func metricsFlag(c *cobra.Command, addr *string) {
	c.Flags().StringVar(addr, "metrics", "", "serve Prometheus metrics on http://ADDR/metrics, a loopback address such as 127.0.0.1:9464 (port 0 picks one; the address is printed on stderr)")
}

// serveMetrics serves this process's metrics on addr until ctx ends, if
// addr is set, and says where on stderr.
func (e *env) serveMetrics(ctx context.Context, addr string) error {
	if addr == "" {
		return nil
	}
	got, err := metrics.Default().Serve(ctx, addr)
	if err != nil {
		return withCode(ExitUsage, err)
	}
	fmt.Fprintf(e.stderr, "cairn: metrics on http://%s/metrics\n", got)
	return nil
}
