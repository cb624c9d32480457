package realm

import (
	"bufio"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"
)

// FuzzControlRequest: any request line on the node's control socket gets
// one reply line of this version; a request reaches the node's loop only
// if it is a standby or resume of this version in under 1 KiB, anything
// else is answered with an error; never a panic.
func FuzzControlRequest(f *testing.F) {
	f.Add([]byte(`{"v":1,"op":"standby"}`))
	f.Add([]byte(`{"v":1,"op":"resume"}`))
	f.Add([]byte(`{"v":2,"op":"standby"}`))
	f.Add([]byte(`{"v":1,"op":"reboot"}`))
	f.Add([]byte(`{"v":1,"op":"st\`))
	f.Add([]byte(`{"":2,"cy":"copies:2@a,b","pr\`))
	f.Fuzz(func(t *testing.T, line []byte) {
		if strings.ContainsRune(string(line), '\n') {
			return // one line is one request
		}
		client, server := net.Pipe()
		defer client.Close()
		reqs := make(chan powerReq, 1)
		quit := make(chan struct{})
		defer close(quit)
		done := make(chan struct{})
		go func() {
			defer close(done)
			handleControl(server, reqs, quit)
		}()
		go func() {
			if pr, ok := <-reqs; ok {
				pr.reply <- ControlReply{State: "taken"}
			}
		}()
		_ = client.SetDeadline(time.Now().Add(10 * time.Second))
		go client.Write(append(append([]byte{}, line...), '\n'))
		got, err := bufio.NewReader(client).ReadBytes('\n')
		if err != nil {
			t.Fatalf("no reply to %q: %v", line, err)
		}
		<-done
		var rep ControlReply
		if err := json.Unmarshal(got, &rep); err != nil || rep.V != ControlVersion {
			t.Fatalf("reply %q to %q: %v", got, line, err)
		}
		var req ControlRequest
		valid := len(line) < 1<<10 && json.Unmarshal(line, &req) == nil && req.V == ControlVersion && (req.Op == "standby" || req.Op == "resume")
		if valid != (rep.State == "taken") || valid == (rep.Error != "") {
			t.Fatalf("request %q (valid %v) got %+v", line, valid, rep)
		}
	})
}
