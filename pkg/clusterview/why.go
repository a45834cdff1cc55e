package clusterview

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// Where a pod stands, as Why says it.
const (
	StateGone       = "Gone"       // the pod no longer exists
	StateFinished   = "Finished"   // it ran to its end
	StateRunning    = "Running"    // it runs on its GPU shares
	StateWaitingGPU = "WaitingGPU" // a claim of it is not placed
	StateScheduling = "Scheduling" // its claims are placed; kube-scheduler has not bound it
	StateStarting   = "Starting"   // it is bound to a node and not running yet
)

// WhyReport is why a pod waits, or where it went.
type WhyReport struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	State     string `json:"state"`
	// Summary says it in one sentence.
	Summary string `json:"summary"`
	Phase   string `json:"phase,omitempty"`
	Node    string `json:"node,omitempty"`
	// Scheduler is kube-scheduler's word on a pod it has not bound.
	Scheduler string     `json:"scheduler,omitempty"`
	Claims    []WhyClaim `json:"claims"`
	Events    []WhyEvent `json:"events"`
}

// WhyClaim is one claim of the pod.
type WhyClaim struct {
	// Name is the pod's name for the claim; Claim the ResourceClaim's ("" until created).
	Name   string `json:"name"`
	Claim  string `json:"claim,omitempty"`
	Fgpu   bool   `json:"fgpu"`
	Placed bool   `json:"placed"`
	// Shares are where it was placed: "node/gpu: 10Gi, 25% compute, mps".
	Shares []string `json:"shares,omitempty"`
	// Status is the allocator's latest word on it: the claim's fgpu.dev/status annotation.
	// Never an event: whoever may write events in the namespace can write one in any name.
	Status string `json:"status,omitempty"`
}

// WhyEvent is an event on the pod or one of its claims.
type WhyEvent struct {
	Time    time.Time `json:"time"`
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Object  string    `json:"object"` // pod/NAME or resourceclaim/NAME
	Source  string    `json:"source"`
	Message string    `json:"message"`
}

// whyEvents is how many of the newest events Why keeps.
const whyEvents = 10

// Why gathers why the pod namespace/name waits, or where it went: its phase and node, its
// claims' allocations, the allocator's and kube-scheduler's word on them (the claims' status
// annotation and the pod's PodScheduled condition), and, as history, the newest events on the
// pod and its claims. A pod that is gone is told from the events it left (the API server
// keeps them an hour by default).
func Why(ctx context.Context, c kubernetes.Interface, driver, namespace, name string) (*WhyReport, error) {
	r := &WhyReport{Namespace: namespace, Pod: name, Claims: []WhyClaim{}, Events: []WhyEvent{}}
	pod, err := c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		pod, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get pod: %w", err)
	}
	objects := map[string]bool{"Pod/" + name: true}
	claims := map[string]*resourceapi.ResourceClaim{}
	if pod != nil {
		r.Phase, r.Node = string(pod.Status.Phase), pod.Spec.NodeName
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
				r.Scheduler = cond.Message
			}
		}
		for _, pc := range pod.Spec.ResourceClaims {
			wc := WhyClaim{Name: pc.Name}
			if pc.ResourceClaimName != nil {
				wc.Claim = *pc.ResourceClaimName
			}
			for _, st := range pod.Status.ResourceClaimStatuses {
				if st.Name == pc.Name && st.ResourceClaimName != nil {
					wc.Claim = *st.ResourceClaimName
				}
			}
			if wc.Claim != "" {
				cl, err := c.ResourceV1().ResourceClaims(namespace).Get(ctx, wc.Claim, metav1.GetOptions{})
				switch {
				case err == nil:
					claims[wc.Claim] = cl
					objects["ResourceClaim/"+wc.Claim] = true
					describeClaim(&wc, cl, driver)
				case !apierrors.IsNotFound(err):
					return nil, fmt.Errorf("get claim %s: %w", wc.Claim, err)
				}
			}
			r.Claims = append(r.Claims, wc)
		}
	}
	if err := r.gatherEvents(ctx, c, pod, objects); err != nil {
		return nil, err
	}
	r.summarize(pod)
	return r, nil
}

// describeClaim fills in a claim's placement and its status annotation.
func describeClaim(wc *WhyClaim, cl *resourceapi.ResourceClaim, driver string) {
	wc.Fgpu = fgpuClaim(cl, driver)
	if a := cl.Status.Allocation; a != nil {
		wc.Placed = true
		for _, res := range a.Devices.Results {
			if res.Driver != driver {
				continue
			}
			s := res.Pool + "/" + res.Device + ": "
			if m, ok := res.ConsumedCapacity[api.CapacityMemory]; ok {
				comp := res.ConsumedCapacity[api.CapacityCompute]
				s += fmt.Sprintf("%s, %d%% compute", q(m.Value()), comp.Value())
			} else {
				s += "whole GPU"
			}
			if mode := modeOf(*cl, res); mode != "-" {
				s += ", " + mode
			}
			wc.Shares = append(wc.Shares, s)
		}
	}
	wc.Status = cl.Annotations[api.AnnotationStatus]
}

// fgpuClaim reports whether fgpu places the claim: it asks for one of fgpu's device classes,
// or it is allocated on the driver's devices.
func fgpuClaim(cl *resourceapi.ResourceClaim, driver string) bool {
	ours := func(class string) bool { return class == api.DeviceClassShared || class == api.DeviceClassExclusive }
	for _, rq := range cl.Spec.Devices.Requests {
		if rq.Exactly != nil && ours(rq.Exactly.DeviceClassName) {
			return true
		}
		for _, sub := range rq.FirstAvailable {
			if ours(sub.DeviceClassName) {
				return true
			}
		}
	}
	if a := cl.Status.Allocation; a != nil {
		for _, res := range a.Devices.Results {
			if res.Driver == driver {
				return true
			}
		}
	}
	return false
}

// gatherEvents keeps the newest events on the pod (this incarnation of it, where it exists)
// and its claims.
func (r *WhyReport) gatherEvents(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, objects map[string]bool) error {
	var all []corev1.Event
	for obj := range objects {
		name := obj[strings.Index(obj, "/")+1:]
		list, err := c.CoreV1().Events(r.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.name", name).String()})
		if err != nil {
			return fmt.Errorf("list events: %w", err)
		}
		all = append(all, list.Items...)
	}
	seen := map[string]bool{}
	for _, ev := range all {
		key := ev.InvolvedObject.Kind + "/" + ev.InvolvedObject.Name
		if !objects[key] || seen[ev.Namespace+"/"+ev.Name] {
			continue
		}
		if pod != nil && ev.InvolvedObject.Kind == "Pod" && ev.InvolvedObject.UID != "" && ev.InvolvedObject.UID != pod.UID {
			continue // an earlier pod of the same name
		}
		seen[ev.Namespace+"/"+ev.Name] = true
		src := ev.Source.Component
		if src == "" {
			src = ev.ReportingController
		}
		r.Events = append(r.Events, WhyEvent{Time: eventTime(ev), Type: ev.Type, Reason: ev.Reason,
			Object: strings.ToLower(ev.InvolvedObject.Kind) + "/" + ev.InvolvedObject.Name, Source: src, Message: ev.Message})
	}
	sort.SliceStable(r.Events, func(i, j int) bool { return r.Events[i].Time.Before(r.Events[j].Time) })
	if len(r.Events) > whyEvents {
		r.Events = r.Events[len(r.Events)-whyEvents:]
	}
	return nil
}

func (r *WhyReport) summarize(pod *corev1.Pod) {
	switch {
	case pod == nil:
		r.State = StateGone
		r.Summary = fmt.Sprintf("pod %s/%s does not exist", r.Namespace, r.Pod)
		if len(r.Events) > 0 {
			r.Summary += "; the events it left follow"
		} else {
			r.Summary += ", and no events of it remain (events expire, after an hour by default)"
		}
		return
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		r.State = StateFinished
		r.Summary = fmt.Sprintf("the pod finished (%s) on node %s; its claims' shares are released", pod.Status.Phase, pod.Spec.NodeName)
		return
	}
	for _, wc := range r.Claims {
		switch {
		case wc.Claim == "":
			r.State = StateWaitingGPU
			r.Summary = fmt.Sprintf("claim %q of the pod is not created yet (kube-controller-manager creates it from its template)", wc.Name)
			return
		case wc.Fgpu && !wc.Placed:
			r.State = StateWaitingGPU
			r.Summary = fmt.Sprintf("fgpu has not placed claim %s", wc.Claim)
			if wc.Status != "" {
				r.Summary += ": " + wc.Status
			} else {
				r.Summary += "; the allocator has said nothing of it yet (is fgpu-allocator running?)"
			}
			return
		}
	}
	shares := r.shares()
	switch {
	case pod.Status.Phase == corev1.PodRunning:
		r.State = StateRunning
		r.Summary = fmt.Sprintf("running on node %s", pod.Spec.NodeName)
		if shares != "" {
			r.Summary += " with GPU shares " + shares
		}
	case pod.Spec.NodeName == "":
		r.State = StateScheduling
		r.Summary = "fgpu placed its claims"
		if shares != "" {
			r.Summary += " (" + shares + ")"
		}
		r.Summary += "; kube-scheduler has not bound the pod"
		if r.Scheduler != "" {
			r.Summary += ": " + r.Scheduler
		}
	default:
		r.State = StateStarting
		r.Summary = fmt.Sprintf("bound to node %s and starting", pod.Spec.NodeName)
		for _, cs := range pod.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason != "" {
				r.Summary += fmt.Sprintf("; container %s: %s", cs.Name, w.Reason)
				if w.Message != "" {
					r.Summary += " (" + w.Message + ")"
				}
			}
		}
	}
}

func (r *WhyReport) shares() string {
	var all []string
	for _, wc := range r.Claims {
		all = append(all, wc.Shares...)
	}
	return strings.Join(all, "; ")
}

// PrintWhy writes the report for a person, wrapped to 80 columns.
func PrintWhy(w io.Writer, r *WhyReport, now time.Time) error {
	var b strings.Builder
	head := fmt.Sprintf("Pod %s/%s: %s", r.Namespace, r.Pod, r.State)
	if r.Phase != "" {
		head += " (phase " + r.Phase + ")"
	}
	b.WriteString(head + "\n")
	wrap(&b, r.Summary, "  ", "  ")
	if len(r.Claims) > 0 {
		b.WriteString("Claims:\n")
	}
	for _, wc := range r.Claims {
		line := wc.Name
		if wc.Claim != "" && wc.Claim != wc.Name {
			line += " (" + wc.Claim + ")"
		}
		switch {
		case wc.Claim == "":
			line += ": not created yet"
		case !wc.Fgpu:
			line += ": not an fgpu claim"
		case wc.Placed:
			line += ": placed on " + strings.Join(wc.Shares, "; ")
		default:
			line += ": waiting"
			if wc.Status != "" && strings.Contains(r.Summary, wc.Status) {
				line += " (the allocator's status, as above)"
			}
		}
		wrap(&b, line, "  ", "    ")
		if wc.Status != "" && !wc.Placed && !strings.Contains(r.Summary, wc.Status) {
			wrap(&b, "the allocator's status: "+wc.Status, "    ", "      ")
		}
	}
	if r.Scheduler != "" && r.State != StateScheduling {
		wrap(&b, "kube-scheduler: "+r.Scheduler, "", "  ")
	}
	if len(r.Events) > 0 {
		wrap(&b, "Events, oldest first: history, not fgpu's verdict (anyone who may write events in the namespace can add to it):", "", "  ")
	}
	for _, ev := range r.Events {
		src := ev.Source
		if src == "" {
			src = "no source"
		}
		wrap(&b, fmt.Sprintf("%s ago  %s %s  %s (from %s): %s", age(now.Sub(ev.Time)), ev.Type, ev.Reason, ev.Object, src, ev.Message), "  ", "      ")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// width is the terminal width the tables and reports fit.
const width = 80

// wrap writes text in lines of at most width runes, the first with indent, the others with
// cont; a word longer than a line is cut.
func wrap(b *strings.Builder, text, indent, cont string) {
	line, pre := "", indent
	flush := func() {
		b.WriteString(pre + line + "\n")
		line, pre = "", cont
	}
	for _, word := range strings.Fields(text) {
		for len([]rune(pre))+len([]rune(word)) > width {
			if line != "" {
				flush()
				continue
			}
			r := []rune(word)
			cut := width - len([]rune(pre))
			line = string(r[:cut])
			word = string(r[cut:])
			flush()
		}
		switch {
		case line == "":
			line = word
		case len([]rune(pre+line))+1+len([]rune(word)) <= width:
			line += " " + word
		default:
			flush()
			line = word
		}
	}
	if line != "" {
		flush()
	}
}

// age is a duration as kubectl shows ages: 45s, 3m, 2h, 5d.
func age(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(max(d, 0).Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}
