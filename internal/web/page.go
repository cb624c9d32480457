package web

import (
	"bytes"
	"fmt"
	"net/http"
	"time"

	"cairn.dev/cairn/internal/apitypes"
)

// pageData is what the page's template draws; the script then keeps it
// up to date from the API.
type pageData struct {
	Device  string
	Devices []apitypes.Device
	Stores  []apitypes.StoreInfo
	Volumes []apitypes.Volume
	Work    apitypes.Work
	Status  *apitypes.Status
	// Errors says which sections could not be read, by section.
	Errors map[string]string
}

func (h *Handler) servePage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d := pageData{Device: h.src.Device(), Errors: map[string]string{}}
	var err error
	if d.Devices, err = h.src.Devices(ctx); err != nil {
		d.Errors["devices"] = err.Error()
	}
	if d.Stores, err = h.stores.get(ctx); err != nil {
		d.Errors["stores"] = err.Error()
	}
	if d.Volumes, err = h.volumes.get(ctx); err != nil {
		d.Errors["volumes"] = err.Error()
	}
	if d.Work, err = h.src.Work(ctx); err != nil {
		d.Errors["work"] = err.Error()
	}
	if d.Status, err = h.status.get(ctx); err != nil {
		d.Errors["problems"] = err.Error()
	}
	var buf bytes.Buffer
	if err := h.page.Execute(&buf, d); err != nil {
		h.log.Error("web page", "err", err)
		http.Error(w, "cannot draw the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(buf.Bytes())
}

func (h *Handler) serveAsset(name, ctype string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, err := assets.ReadFile(name)
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", ctype)
		w.Write(b)
	}
}

// apitypes.IBytes is n in binary units, as the CLI shows sizes.
func showTime(t any) string {
	switch v := t.(type) {
	case time.Time:
		if v.IsZero() {
			return "-"
		}
		return v.UTC().Format("2006-01-02 15:04:05Z")
	case *time.Time:
		if v == nil {
			return "never"
		}
		return v.UTC().Format("2006-01-02 15:04:05Z")
	}
	return fmt.Sprint(t)
}

func showRate(r float64) string { return apitypes.IBytes(int64(r)) + "/s" }

func sumRequests(m map[string]int64) int64 {
	var n int64
	for _, c := range m {
		n += c
	}
	return n
}
