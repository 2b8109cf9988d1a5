package benchcmp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// httpFloorEnv, when set, makes this test binary the bare HTTP floor's
// server instead of running tests: the value is the file of the answers
// it gives (see serveHTTPFloor).
const httpFloorEnv = "STARLEASE_BENCH_HTTP_FLOOR_ANSWERS"

func TestMain(m *testing.M) {
	if answers := os.Getenv(httpFloorEnv); answers != "" {
		os.Exit(serveHTTPFloor(answers))
	}
	os.Exit(m.Run())
}

// exchange is one request the Go client made to starlease serve and the
// answer it got, recorded so that the floor sends and answers the same
// bytes.
type exchange struct {
	Method, Path string
	reqHeader    http.Header // stays in the benchmark: it holds the key
	Body         []byte
	Status       int
	Header       http.Header
	Answer       []byte
}

// recorder is a RoundTripper that keeps each exchange it carries.
type recorder struct {
	next http.RoundTripper
	got  []exchange
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		body = b
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	res, err := r.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	answer, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		return nil, err
	}
	res.Body = io.NopCloser(bytes.NewReader(answer))
	h := res.Header.Clone()
	h.Del("Date") // the floor's server writes its own
	r.got = append(r.got, exchange{Method: req.Method, Path: req.URL.RequestURI(), reqHeader: req.Header.Clone(), Body: body,
		Status: res.StatusCode, Header: h, Answer: answer})
	return res, nil
}

// httpFloorRow is the serve goal's floor: the bytes of one acquire and one
// release of the Go client against starlease serve (recorded), sent over
// loopback with net/http to a server process that decodes each body as
// JSON and answers the recorded answer, which the client reads and
// decodes; nothing else (no authentication, store, audit or strict
// decoding). One op is the pair, as for serve.
func httpFloorRow(b *testing.B, recorded []exchange) row {
	answers, err := json.Marshal(recorded)
	if err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(b.TempDir(), "answers.json")
	if err := os.WriteFile(file, answers, 0o600); err != nil {
		b.Fatal(err)
	}
	srv := exec.Command(os.Args[0])
	srv.Env = append(os.Environ(), httpFloorEnv+"="+file)
	srv.Stderr = os.Stderr
	out, err := srv.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatalf("start the HTTP floor's server: %v", err)
	}
	b.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	addr := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		addr <- strings.TrimSpace(line)
	}()
	var base string
	select {
	case a := <-addr:
		if a == "" {
			b.Fatal("the HTTP floor's server exited before it listened")
		}
		base = "http://" + a
	case <-time.After(30 * time.Second):
		b.Fatal("the HTTP floor's server did not listen within 30 s")
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	b.Cleanup(hc.CloseIdleConnections)
	return row{name: "floor HTTP (net/http, serve's bytes)", concs: []int{1, 50, 64}, pid: func() int { return srv.Process.Pid },
		worker: func(int) (func() error, error) {
			return func() error {
				for _, x := range recorded {
					req, err := http.NewRequestWithContext(bg, x.Method, base+x.Path, bytes.NewReader(x.Body))
					if err != nil {
						return err
					}
					req.Header = x.reqHeader.Clone()
					res, err := hc.Do(req)
					if err != nil {
						return err
					}
					answer, err := io.ReadAll(res.Body)
					res.Body.Close()
					if err != nil {
						return err
					}
					var v any
					if err := json.Unmarshal(answer, &v); err != nil || res.StatusCode != x.Status || len(answer) != len(x.Answer) {
						return fmt.Errorf("%s %s: floor answered %d with %d bytes (%v), recorded %d with %d", x.Method, x.Path,
							res.StatusCode, len(answer), err, x.Status, len(x.Answer))
					}
				}
				return nil
			}, nil
		}}
}

// serveHTTPFloor runs the floor's server: it listens on a loopback port,
// prints its address, and answers each request with the recorded answer
// of the first exchange of the same method and path, after reading and
// decoding the request's body. It returns only on failure.
func serveHTTPFloor(answersFile string) int {
	b, err := os.ReadFile(answersFile)
	var recorded []exchange
	if err == nil {
		err = json.Unmarshal(b, &recorded)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "HTTP floor:", err)
		return 2
	}
	answers := map[string]exchange{}
	for _, x := range recorded {
		if _, ok := answers[x.Method+" "+x.Path]; !ok {
			answers[x.Method+" "+x.Path] = x
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "HTTP floor:", err)
		return 2
	}
	fmt.Println(ln.Addr().String())
	err = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x, ok := answers[r.Method+" "+r.URL.RequestURI()]
		var v any
		if body, err := io.ReadAll(r.Body); !ok || err != nil || json.Unmarshal(body, &v) != nil {
			http.Error(w, "not a recorded request", http.StatusBadRequest)
			return
		}
		for k, vs := range x.Header {
			w.Header()[k] = vs
		}
		w.WriteHeader(x.Status)
		w.Write(x.Answer)
	}))
	fmt.Fprintln(os.Stderr, "HTTP floor:", err)
	return 2
}
