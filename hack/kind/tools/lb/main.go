// Command lb stands in for envoy as kind's control-plane load balancer
// (kind v0.33 runs docker.io/envoyproxy/envoy, which no Debian package or Go
// module provides). Started as kind starts envoy (`envoy -c <bootstrap>`), it
// follows the files kind writes for envoy's dynamic configuration: the
// listener's port from lds.yaml and the apiservers from cds.yaml, re-read
// every second, and forwards each TCP connection to the next apiserver that
// accepts it, round robin.
package main

import (
	"flag"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

var (
	portRE     = regexp.MustCompile(`port_value:\s*(\d+)`)
	endpointRE = regexp.MustCompile(`address:\s*"?([^\s"]+)"?\s*\n\s*port_value:\s*(\d+)`)
)

type backends struct {
	mu    sync.Mutex
	addrs []string
	next  atomic.Uint64
}

func (b *backends) set(addrs []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(addrs) != len(b.addrs) {
		log.Printf("backends: %v", addrs)
	}
	b.addrs = addrs
}

func (b *backends) list() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.addrs...)
}

func main() {
	config := flag.String("c", "/home/envoy/envoy.yaml", "envoy's bootstrap config; lds.yaml and cds.yaml are read from its directory")
	flag.Parse()
	dir := filepath.Dir(*config)
	var b backends
	listening := false
	for {
		if lds, err := os.ReadFile(filepath.Join(dir, "lds.yaml")); err == nil && !listening {
			if m := portRE.FindSubmatch(lds); m != nil {
				ln, err := net.Listen("tcp", ":"+string(m[1]))
				if err != nil {
					log.Fatal(err)
				}
				log.Printf("listening on %s", ln.Addr())
				listening = true
				go serve(ln, &b)
			}
		}
		if cds, err := os.ReadFile(filepath.Join(dir, "cds.yaml")); err == nil {
			var addrs []string
			for _, m := range endpointRE.FindAllSubmatch(cds, -1) {
				if _, err := strconv.Atoi(string(m[2])); err == nil {
					addrs = append(addrs, net.JoinHostPort(string(m[1]), string(m[2])))
				}
			}
			b.set(addrs)
		}
		time.Sleep(time.Second)
	}
}

func serve(ln net.Listener, b *backends) {
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go forward(c, b)
	}
}

func forward(c net.Conn, b *backends) {
	defer c.Close()
	addrs := b.list()
	start := b.next.Add(1)
	for i := range addrs {
		addr := addrs[(int(start)+i)%len(addrs)]
		u, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			continue
		}
		defer u.Close()
		done := make(chan struct{}, 2)
		go func() { io.Copy(u, c); u.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
		go func() { io.Copy(c, u); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
		<-done
		<-done
		return
	}
}
