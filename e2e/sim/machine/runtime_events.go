package machine

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/protobuf/proto"
)

// machined publishes runtime events (MachineService.Events, talosctl
// events) as Talos does (internal/app/machined/pkg/runtime/events.go, the
// controller in v1alpha1_controller.go): a sequence run through the API
// publishes SequenceEvent START, then for each phase PhaseEvent START, each
// task TaskEvent START and STOP, PhaseEvent STOP, under the actor ID the
// call answered with; a sequence that cannot take the lock publishes a
// NOOP SequenceEvent with a LOCKED error and no actor; every change of the
// MachineStatus resource publishes a MachineStatusEvent (the
// MachineStatusPublisher controller). machined keeps the events in memory,
// so a boot starts a new stream: a watch ends when the machine goes down.
//
// talosctl reboot and upgrade follow a node by these (cmd/talosctl/pkg/
// talos/action): they watch from now, call, and wait for the SequenceEvent
// "reboot" (or the task "stopAllServices") of their actor; then they watch
// again with the whole tail, retrying while the node is down, until a
// MachineStatusEvent says running and ready, and check that the boot ID
// changed.

// RuntimeEvent is one event of the machine's runtime event stream.
type RuntimeEvent struct {
	// ID orders the events of the boot: an xid, increasing.
	ID string
	// ActorID is the ID the API call that caused it answered with; "" for
	// the machine's own (its boot, its status).
	ActorID string
	// At is when it was published.
	At time.Time
	// Payload is a machineapi SequenceEvent, PhaseEvent, TaskEvent or
	// MachineStatusEvent.
	Payload proto.Message
}

// EventsTail says which past events a watch starts with, as an
// EventsRequest does: the last Events (all when negative), those after ID,
// or those of the last Seconds; only ActorID's when it is set.
type EventsTail struct {
	Events  int32
	ID      string
	Seconds int32
	ActorID string
}

// eventCapacity is how many events machined keeps (its runtime's buffer).
const eventCapacity = 1000

// eventStream is one boot's events and its watchers. seq numbers the
// machine's events across its boots, so that IDs keep increasing over a
// reboot however fast (talosctl 1.14.1 resumes a watch after a reboot from
// the last ID it saw).
type eventStream struct {
	seq      *atomic.Uint32
	mu       sync.Mutex
	events   []RuntimeEvent
	watchers map[chan RuntimeEvent]string // the actor each wants ("": all)
	ended    bool
}

func newEventStream(seq *atomic.Uint32) *eventStream {
	return &eventStream{seq: seq, watchers: map[chan RuntimeEvent]string{}}
}

// end ends the stream: every watch's channel is closed and new watches
// refused, as the boot's machined goes away.
func (s *eventStream) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	for ch := range s.watchers {
		close(ch)
		delete(s.watchers, ch)
	}
}

// publish adds an event and hands it to the watchers; a watcher that fell
// a whole buffer behind is dropped (its watch ends, as Talos ends one that
// lost events).
func (s *eventStream) publish(actor string, payload proto.Message) {
	if s == nil {
		return // not booted yet (powered off from the start)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	ev := RuntimeEvent{ID: newXID(s.seq.Add(1)), ActorID: actor, At: time.Now(), Payload: payload}
	s.events = append(s.events, ev)
	if len(s.events) > eventCapacity {
		s.events = s.events[len(s.events)-eventCapacity:]
	}
	for ch, want := range s.watchers {
		if want != "" && want != actor {
			continue
		}
		select {
		case ch <- ev:
		default:
			close(ch)
			delete(s.watchers, ch)
		}
	}
}

// watch returns the past events tail asks for and a channel of those that
// follow; cancel releases it.
func (s *eventStream) watch(tail EventsTail) ([]RuntimeEvent, <-chan RuntimeEvent, func(), error) {
	set := 0
	for _, on := range []bool{tail.Events != 0, tail.ID != "", tail.Seconds != 0} {
		if on {
			set++
		}
	}
	if set > 1 {
		return nil, nil, nil, fmt.Errorf("only one of tail events, tail ID or tail duration may be given")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil, nil, nil, errEventsEnded
	}
	var mine []RuntimeEvent
	for _, ev := range s.events {
		if tail.ActorID == "" || ev.ActorID == tail.ActorID {
			mine = append(mine, ev)
		}
	}
	var past []RuntimeEvent
	switch {
	case tail.Events < 0:
		past = mine
	case tail.Events > 0:
		past = mine[max(0, len(mine)-int(tail.Events)):]
	case tail.ID != "":
		for _, ev := range mine {
			if ev.ID > tail.ID {
				past = append(past, ev)
			}
		}
	case tail.Seconds > 0:
		since := time.Now().Add(-time.Duration(tail.Seconds) * time.Second)
		for _, ev := range mine {
			if !ev.At.Before(since) {
				past = append(past, ev)
			}
		}
	}
	ch := make(chan RuntimeEvent, eventCapacity)
	s.watchers[ch] = tail.ActorID
	return append([]RuntimeEvent(nil), past...), ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.watchers[ch]; ok {
			close(ch)
			delete(s.watchers, ch)
		}
	}, nil
}

// actorKey is the context key of the actor ID of the API call a sequence
// runs for (Talos' runtime.ActorIDCtxKey).
type actorKey struct{}

// WithActorID returns ctx carrying the actor ID the API call answers with:
// the sequence it starts publishes its events under it.
func WithActorID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, actorKey{}, id)
}

// ActorID is the actor ID ctx carries ("" when none).
func ActorID(ctx context.Context) string {
	id, _ := ctx.Value(actorKey{}).(string)
	return id
}

// errEventsEnded is a watch of a boot that has ended.
var errEventsEnded = fmt.Errorf("the boot's event stream has ended")

// xidEncoding is xid's: base32 with the extended hex alphabet, lower case.
var xidEncoding = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

// xidMachine is this process's part of the IDs.
var xidMachine = func() [5]byte {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return b
}()

// newXID returns an ID in xid's form (the 20 characters Talos' event IDs
// have): seconds since the epoch, a process part, a counter, so that IDs
// sort as they were made.
func newXID(counter uint32) string {
	var b [12]byte
	binary.BigEndian.PutUint32(b[0:4], uint32(time.Now().Unix()))
	copy(b[4:9], xidMachine[:])
	b[9], b[10], b[11] = byte(counter>>16), byte(counter>>8), byte(counter)
	return strings.ToLower(xidEncoding.EncodeToString(b[:]))
}

// WatchEvents watches the machine's runtime events (MachineService.Events):
// the past events of its boot that tail asks for, then a channel of those
// that follow, closed when the boot ends or cancel is called. A machine
// that is down refuses the watch.
func (m *Machine) WatchEvents(tail EventsTail) (past []RuntimeEvent, next <-chan RuntimeEvent, cancel func(), err error) {
	m.mu.Lock()
	s, up := m.events, m.st.Up
	m.mu.Unlock()
	if !up {
		return nil, nil, nil, m.errDown()
	}
	past, next, cancel, err = s.watch(tail)
	if err == errEventsEnded {
		return nil, nil, nil, m.errDown()
	}
	return past, next, cancel, err
}

// NewEventID returns a new ID of the machine's events, for one that is not
// kept (the hello event a watch starts with).
func (m *Machine) NewEventID() string {
	return newXID(m.eventSeq.Add(1))
}

// publish publishes a runtime event of the current boot.
func (m *Machine) publish(actor string, payload proto.Message) {
	m.mu.Lock()
	s := m.events
	m.mu.Unlock()
	s.publish(actor, payload)
}

// newBootEvents starts the event stream of a new boot, ending the last.
func (m *Machine) newBootEvents() {
	s := newEventStream(&m.eventSeq)
	m.mu.Lock()
	old := m.events
	m.events = s
	m.mu.Unlock()
	if old != nil {
		old.end()
	}
}

// endBootEvents ends the current boot's event stream (the machine goes
// down).
func (m *Machine) endBootEvents() {
	m.mu.Lock()
	s := m.events
	m.mu.Unlock()
	if s != nil {
		s.end()
	}
}

// sequenceEvents publishes a sequence's events as it runs (see the top of
// this file), under the actor of the call that started it.
type sequenceEvents struct {
	m     *Machine
	name  string
	actor string
}

// start publishes the sequence's SequenceEvent START.
func (s sequenceEvents) start() {
	s.m.publish(s.actor, &machineapi.SequenceEvent{Sequence: s.name, Action: machineapi.SequenceEvent_START})
}

// phase publishes the events of one phase and its task (Talos' names,
// v1alpha1_sequencer.go and its tasks).
func (s sequenceEvents) phase(phase, task string) {
	s.m.publish(s.actor, &machineapi.PhaseEvent{Phase: phase, Action: machineapi.PhaseEvent_START})
	s.m.publish(s.actor, &machineapi.TaskEvent{Task: task, Action: machineapi.TaskEvent_START})
	s.m.publish(s.actor, &machineapi.TaskEvent{Task: task, Action: machineapi.TaskEvent_STOP})
	s.m.publish(s.actor, &machineapi.PhaseEvent{Phase: phase, Action: machineapi.PhaseEvent_STOP})
}

// shutdown publishes the phases a reboot or upgrade sequence runs from its
// cleanup to its reboot, past which the machine is down: the pods and
// services stopped ("stopAllServices", which talosctl's follower waits
// for), then the reboot.
func (s sequenceEvents) shutdown() {
	for _, p := range [][2]string{{"cleanup", "stopAllPods"}, {"dbus", "stopDBus"}, {"stopServices", "stopServicesForUpgrade"},
		{"stopEverything", "stopAllServices"}, {"reboot", "reboot"}} {
		s.phase(p[0], p[1])
	}
}

// failed publishes the NOOP SequenceEvent of a sequence that failed.
func (s sequenceEvents) failed(err error) {
	s.m.publish(s.actor, &machineapi.SequenceEvent{
		Sequence: s.name, Action: machineapi.SequenceEvent_NOOP,
		Error: &common.Error{Code: common.Code_FATAL, Message: "sequence failed: " + err.Error()},
	})
}

// lockedSequence publishes what Talos publishes when a sequence cannot take
// the lock: a NOOP with a LOCKED error, under no actor.
func (m *Machine) lockedSequence(name string) {
	m.publish("", &machineapi.SequenceEvent{
		Sequence: name, Action: machineapi.SequenceEvent_NOOP,
		Error: &common.Error{Code: common.Code_LOCKED, Message: "sequence not started: locked"},
	})
}

// statusEvent is a MachineStatusEvent of the MachineStatus resource.
func statusEvent(stage runtime.MachineStage, ready bool, unmet []runtime.UnmetCondition) *machineapi.MachineStatusEvent {
	ev := &machineapi.MachineStatusEvent{
		Stage:  machineapi.MachineStatusEvent_MachineStage(stage),
		Status: &machineapi.MachineStatusEvent_MachineStatus{Ready: ready},
	}
	for _, u := range unmet {
		ev.Status.UnmetConditions = append(ev.Status.UnmetConditions,
			&machineapi.MachineStatusEvent_MachineStatus_UnmetCondition{Name: u.Name, Reason: u.Reason})
	}
	return ev
}
