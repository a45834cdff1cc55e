package loadgen

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Allocator reads what the running allocator spent: its process CPU (from /proc/<PID>/stat
// on this machine, or process_cpu_seconds_total from its metrics) and its API writes by
// kind (fgpu_allocator_api_writes_total, from its metrics). Read before and after a burst,
// the differences over the claims placed are its CPU and writes per claim.
type Allocator struct {
	PID int // the allocator's process on this machine (0: none)
	// MetricsURL is its /metrics (e.g. https://<pod IP>:9465/metrics), read with Token;
	// Insecure skips verifying its certificate (self-signed unless one was given).
	MetricsURL, Token string
	Insecure          bool
}

// Usage is one reading.
type Usage struct {
	CPU    time.Duration
	Writes map[string]float64 // "verb resource" → count
	Placed float64            // fgpu_allocator_claims_placed_total
	HasCPU bool
	// HasMetrics says Writes and Placed were read.
	HasMetrics bool
}

// Read takes a reading.
func (a Allocator) Read(ctx context.Context) (Usage, error) {
	u := Usage{Writes: map[string]float64{}}
	if a.MetricsURL != "" {
		body, err := a.scrape(ctx)
		if err != nil {
			return u, err
		}
		u = parseMetrics(body)
	}
	if a.PID > 0 {
		cpu, err := procCPU(a.PID)
		if err != nil {
			return u, err
		}
		u.CPU, u.HasCPU = cpu, true
	}
	return u, nil
}

func (a Allocator) scrape(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.MetricsURL, nil)
	if err != nil {
		return "", err
	}
	if a.Token != "" {
		req.Header.Set("Authorization", "Bearer "+a.Token)
	}
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment}
	if a.Insecure {
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // asked for: the allocator's certificate is self-signed by default
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", a.MetricsURL, resp.Status)
	}
	return string(b), nil
}

// parseMetrics reads the allocator's CPU, writes and placements from the text format.
func parseMetrics(body string) Usage {
	u := Usage{Writes: map[string]float64{}, HasMetrics: true}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name, labels, _ := strings.Cut(line[:i], "{")
		switch name {
		case "process_cpu_seconds_total":
			u.CPU, u.HasCPU = time.Duration(v*float64(time.Second)), true
		case "fgpu_allocator_claims_placed_total":
			u.Placed = v
		case "fgpu_allocator_api_writes_total":
			u.Writes[label(labels, "verb")+" "+label(labels, "resource")] = v
		}
	}
	return u
}

func label(labels, name string) string {
	_, v, ok := strings.Cut(labels, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ = strings.Cut(v, `"`)
	return v
}

// procCPU is a process's user and system CPU from /proc/<pid>/stat (in clock ticks of
// 1/100 s, Linux's USER_HZ).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: count fields after it.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// PerClaim says what the allocator spent between two readings, per claim placed.
func PerClaim(before, after Usage, placed int) string {
	if placed <= 0 {
		return "no claim placed"
	}
	if after.HasMetrics && after.Placed > before.Placed {
		placed = int(after.Placed - before.Placed) // the allocator's own count: retries included
	}
	var b strings.Builder
	fmt.Fprintf(&b, "allocator, %d claims placed:", placed)
	if after.HasCPU && before.HasCPU {
		cpu := after.CPU - before.CPU
		fmt.Fprintf(&b, " CPU %.2fs, %.2f ms per claim;", cpu.Seconds(), float64(cpu)/float64(time.Millisecond)/float64(placed))
	}
	if after.HasMetrics {
		keys := make([]string, 0, len(after.Writes))
		for k := range after.Writes {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		total := 0.0
		var parts []string
		for _, k := range keys {
			if d := after.Writes[k] - before.Writes[k]; d > 0 {
				total += d
				parts = append(parts, fmt.Sprintf("%s %.2f", k, d/float64(placed)))
			}
		}
		fmt.Fprintf(&b, " writes %.0f, %.2f per claim (%s)", total, total/float64(placed), strings.Join(parts, ", "))
	}
	return b.String()
}
