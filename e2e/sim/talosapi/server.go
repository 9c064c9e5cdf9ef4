package talosapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	cosiapi "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/state/protobuf/server"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

const (
	// reconcileInterval is how often an endpoint re-checks its machine's
	// reachability besides the machine's notifications (faults change in a
	// file without a notification).
	reconcileInterval = 100 * time.Millisecond
	// drainGrace is how long in-flight calls may finish when an endpoint
	// closes before their connections are cut.
	drainGrace = 500 * time.Millisecond
)

// Options configure the API server.
type Options struct {
	// Machines are the machines served, each on its IP, port 50000.
	Machines []*machine.Machine
	// CACert and CAKey are the Talos OS CA (PEM) from the machinery secrets
	// bundle: server certificates are signed by it and client certificates
	// must chain to it.
	CACert, CAKey []byte
	// Port overrides the API port (default 50000, constants.ApidPort).
	Port int
	// EtcdURL is the client URL (plain HTTP) of the cluster's real etcd,
	// whose snapshot EtcdSnapshot serves ("": none, the call fails).
	EtcdURL string
	// Listen opens the listener of a machine's API on addr (default
	// net.Listen): the kind e2e opens it in the network namespace of the
	// kind node the machine stands for.
	Listen func(m *machine.Machine, addr string) (net.Listener, error)
	// Log receives diagnostics; nil discards them.
	Log *slog.Logger
}

// Server serves the Talos API of a set of machines.
type Server struct {
	log      *slog.Logger
	ca       *authority
	port     int
	machines []*machine.Machine
	byName   map[string]*machine.Machine
	byIP     map[netip.Addr]*machine.Machine
	authz    authorizer
	etcdURL  string
	listen   func(m *machine.Machine, addr string) (net.Listener, error)

	// raftMu guards stalled: the raft point of each member under the
	// etcdStalled fault (see memberRaft).
	raftMu  sync.Mutex
	stalled map[string]raftPoint

	endpoints []*endpoint
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	stopOnce  sync.Once
}

// Start opens one listener per reachable machine on machine.IP():50000 and
// keeps each open exactly while its machine is reachable, until ctx ends or
// Stop is called.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if len(opts.Machines) == 0 {
		return nil, errors.New("talosapi: no machines")
	}
	ca, err := parseAuthority(opts.CACert, opts.CAKey)
	if err != nil {
		return nil, fmt.Errorf("talosapi: %w", err)
	}
	logger := opts.Log
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	port := opts.Port
	if port == 0 {
		port = constants.ApidPort
	}
	s := &Server{
		log:      logger,
		ca:       ca,
		port:     port,
		machines: opts.Machines,
		byName:   map[string]*machine.Machine{},
		byIP:     map[netip.Addr]*machine.Machine{},
		authz:    authorizer{rules: rules()},
		etcdURL:  opts.EtcdURL,
		listen:   opts.Listen,
		stalled:  map[string]raftPoint{},
	}
	if s.listen == nil {
		s.listen = func(_ *machine.Machine, addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
	}
	for _, m := range opts.Machines {
		if _, dup := s.byName[m.Name()]; dup {
			return nil, fmt.Errorf("talosapi: duplicate machine name %s", m.Name())
		}
		if _, dup := s.byIP[m.IP()]; dup {
			return nil, fmt.Errorf("talosapi: duplicate machine IP %s", m.IP())
		}
		s.byName[m.Name()] = m
		s.byIP[m.IP()] = m
	}
	for _, m := range opts.Machines {
		tlsCfg, err := ca.serverTLS(m)
		if err != nil {
			return nil, fmt.Errorf("talosapi: %w", err)
		}
		e := &endpoint{s: s, m: m, tls: tlsCfg, addr: net.JoinHostPort(m.IP().String(), strconv.Itoa(port))}
		if m.Reachable() {
			if err := e.open(); err != nil {
				for _, o := range s.endpoints {
					o.close(true)
				}
				return nil, fmt.Errorf("talosapi: %w", err)
			}
		}
		s.endpoints = append(s.endpoints, e)
	}
	ctx, s.cancel = context.WithCancel(ctx)
	for _, e := range s.endpoints {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			e.run(ctx)
		}()
	}
	context.AfterFunc(ctx, s.Stop)
	return s, nil
}

// Stop closes every listener and connection.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.cancel()
		s.wg.Wait()
		for _, e := range s.endpoints {
			e.close(true)
		}
	})
}

// endpoint is the listener of one machine.
type endpoint struct {
	s    *Server
	m    *machine.Machine
	tls  *tls.Config
	addr string

	mu  sync.Mutex
	srv *grpc.Server
	lis net.Listener
}

func (e *endpoint) run(ctx context.Context) {
	ch, cancel := e.m.Subscribe()
	defer cancel()
	tick := time.NewTicker(reconcileInterval)
	defer tick.Stop()
	for {
		e.reconcile()
		select {
		case <-ctx.Done():
			return
		case <-ch:
		case <-tick.C:
		}
	}
}

func (e *endpoint) reconcile() {
	want := e.m.Reachable()
	e.mu.Lock()
	open := e.srv != nil
	e.mu.Unlock()
	switch {
	case want && !open:
		if err := e.open(); err != nil {
			e.s.log.Warn("reopen Talos API endpoint", "node", e.m.Name(), "err", err)
		}
	case !want && open:
		e.close(false)
	}
}

func (e *endpoint) open() error {
	lis, err := e.s.listen(e.m, e.addr)
	if err != nil {
		return fmt.Errorf("listen on %s for %s: %w", e.addr, e.m.Name(), err)
	}
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(e.tls)),
		grpc.MaxRecvMsgSize(constants.GRPCMaxMessageSize),
		grpc.ChainUnaryInterceptor(e.s.authz.unary()),
		grpc.ChainStreamInterceptor(e.s.authz.stream()),
	)
	machineapi.RegisterMachineServiceServer(srv, &machineService{s: e.s, self: e.m})
	machineapi.RegisterImageServiceServer(srv, &imageService{s: e.s, self: e.m})
	machineapi.RegisterLifecycleServiceServer(srv, &lifecycleService{s: e.s, self: e.m})
	cosiapi.RegisterStateServer(srv, &stateService{
		State: server.NewState(&routedState{s: e.s, self: e.m}),
		s:     e.s,
		self:  e.m,
	})
	e.mu.Lock()
	e.srv, e.lis = srv, lis
	e.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
	e.s.log.Info("Talos API up", "node", e.m.Name(), "addr", e.addr)
	return nil
}

// close stops accepting connections at once and cuts the open ones after
// drainGrace (at once when hard), as a rebooting node drops them.
func (e *endpoint) close(hard bool) {
	e.mu.Lock()
	srv, lis := e.srv, e.lis
	e.srv, e.lis = nil, nil
	e.mu.Unlock()
	if srv == nil {
		return
	}
	_ = lis.Close()
	e.s.log.Info("Talos API down", "node", e.m.Name(), "addr", e.addr)
	if hard {
		srv.Stop()
		return
	}
	go func() {
		done := make(chan struct{})
		go func() {
			srv.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(drainGrace):
			srv.Stop()
		}
	}()
}

// target is a machine a call is routed to, with the name the client used.
type target struct {
	m    *machine.Machine
	name string
}

// targets resolves the machines a call is for from the "node" / "nodes"
// metadata, as apid does. multi is true for a "nodes" list of more than one.
func (s *Server) targets(ctx context.Context, self *machine.Machine) (ts []target, multi bool, err error) {
	md, _ := metadata.FromIncomingContext(ctx)
	names := md.Get("node")
	if len(names) == 0 {
		names = md.Get("nodes")
	}
	if len(names) == 0 {
		return []target{{m: self, name: self.IP().String()}}, false, nil
	}
	for _, n := range names {
		m, err := s.resolve(n)
		if err != nil {
			return nil, false, err
		}
		ts = append(ts, target{m: m, name: n})
	}
	return ts, len(ts) > 1, nil
}

// single resolves the one machine of a streaming call.
func (s *Server) single(ctx context.Context, self *machine.Machine) (target, error) {
	ts, multi, err := s.targets(ctx, self)
	if err != nil {
		return target{}, err
	}
	if multi {
		return target{}, status.Error(codes.Unimplemented, "the simulated apid proxies streaming calls to a single node only")
	}
	if err := s.reachable(ts[0]); err != nil {
		return target{}, err
	}
	return ts[0], nil
}

// resolve finds a machine by hostname or IP (an optional port is ignored).
func (s *Server) resolve(node string) (*machine.Machine, error) {
	n := strings.TrimSpace(node)
	if host, _, err := net.SplitHostPort(n); err == nil {
		n = host
	}
	if m, ok := s.byName[n]; ok {
		return m, nil
	}
	if ip, err := netip.ParseAddr(n); err == nil {
		if m, ok := s.byIP[ip]; ok {
			return m, nil
		}
	}
	const shown = 5
	known := make([]string, 0, shown+1)
	for i, m := range s.machines {
		if i == shown {
			known = append(known, fmt.Sprintf("and %d more", len(s.machines)-shown))
			break
		}
		known = append(known, m.Name()+" ("+m.IP().String()+")")
	}
	return nil, status.Errorf(codes.NotFound, "node %q is not a machine of this cluster; known nodes: %s", node, strings.Join(known, ", "))
}

// reachable answers Unavailable for a machine that is down, with the error a
// proxied call to a node that refuses connections gets.
func (s *Server) reachable(t target) error {
	if t.m.Reachable() {
		return nil
	}
	return status.Errorf(codes.Unavailable,
		"connection error: desc = \"transport: Error while dialing: dial tcp %s: connect: connection refused\"",
		net.JoinHostPort(t.m.IP().String(), strconv.Itoa(s.port)))
}
