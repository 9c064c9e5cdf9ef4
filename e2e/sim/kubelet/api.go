package kubelet

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

const kubeletPort = 10250

// serveAPI serves the part of the kubelet API the apiserver proxies for
// `kubectl logs`: /containerLogs/{namespace}/{pod}/{container}, with follow
// and tailLines, on the node's own address.
func (n *node) serveAPI(ctx context.Context) error {
	if len(n.k.opts.ServingCert) == 0 {
		return nil
	}
	cert, err := tls.X509KeyPair(n.k.opts.ServingCert, n.k.opts.ServingKey)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(n.k.opts.ClientCA)
	l, err := net.Listen("tcp", net.JoinHostPort(n.m.IP().String(), strconv.Itoa(kubeletPort)))
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(n.serveLogs),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() { _ = srv.ServeTLS(l, "", "") }()
	return nil
}

func (n *node) serveLogs(w http.ResponseWriter, req *http.Request) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	if len(parts) != 4 || parts[0] != "containerLogs" {
		http.Error(w, "the simulated kubelet serves only /containerLogs/{namespace}/{pod}/{container}", http.StatusNotFound)
		return
	}
	r := &podRunner{k: n.k, ns: parts[1], name: parts[2]}
	f, err := os.Open(r.logPath(parts[3]))
	if err != nil {
		http.Error(w, "no logs for "+parts[1]+"/"+parts[2]+"/"+parts[3], http.StatusNotFound)
		return
	}
	defer f.Close()
	q := req.URL.Query()
	if tail, err := strconv.Atoi(q.Get("tailLines")); err == nil && tail >= 0 {
		seekTail(f, tail)
	}
	w.Header().Set("Content-Type", "text/plain")
	flusher, _ := w.(http.Flusher)
	follow := q.Get("follow") == "true"
	buf := make([]byte, 32*1024)
	for {
		nr, err := f.Read(buf)
		if nr > 0 {
			if _, werr := w.Write(buf[:nr]); werr != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if errors.Is(err, io.EOF) {
			if !follow || !n.containerRunning(parts[1], parts[2]) {
				// One more read catches what was written before the end.
				if !follow {
					return
				}
				rest, _ := io.ReadAll(f)
				_, _ = w.Write(rest)
				return
			}
			select {
			case <-req.Context().Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		if err != nil {
			return
		}
	}
}

// containerRunning reports whether the named pod still has a process.
func (n *node) containerRunning(ns, name string) bool {
	for _, r := range n.k.runnersOn(n.name) {
		if r.ns == ns && r.name == name {
			r.mu.Lock()
			running := len(r.procs) > 0
			r.mu.Unlock()
			if running {
				if _, done := r.exited(); !done {
					return true
				}
			}
		}
	}
	return false
}

// seekTail positions f at the start of its last n lines.
func seekTail(f *os.File, n int) {
	var offsets []int64
	var off int64
	sc := bufio.NewReader(f)
	for {
		line, err := sc.ReadBytes('\n')
		if len(line) > 0 {
			offsets = append(offsets, off)
			off += int64(len(line))
		}
		if err != nil {
			break
		}
	}
	start := int64(0)
	if len(offsets) > n {
		start = offsets[len(offsets)-n]
	}
	_, _ = f.Seek(start, io.SeekStart)
}
