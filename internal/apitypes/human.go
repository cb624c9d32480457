package apitypes

import "fmt"

// IBytes formats n bytes in binary units ("512 B", "1.5 KiB", "2.0 GiB"),
// the one way the CLI's tables and the web page show a size.
func IBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
