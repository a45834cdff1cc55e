package main

import (
	"maps"
	"testing"
)

// The real variant's truth is nvidia-smi's text, which no CI machine prints: its parsers are
// checked on the formats the driver prints, MPS clients and server included.
func TestParseNvidiaSMI(t *testing.T) {
	apps, err := parseComputeApps("4242, 6634\n4343, 11020\n4100, 30\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := (procUsage{4242: 6634 << 20, 4343: 11020 << 20, 4100: 30 << 20}); !maps.Equal(apps, want) {
		t.Errorf("compute apps %v; want %v", apps, want)
	}
	pmon := `# gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command 
# Idx           #    C/G      %      %      %      %      %      %    name 
    0       4242   M+C      3      1      -      -      -      -    python3        
    0       4343   M+C     88     40      -      -      -      -    python3        
    0       4100     C      -      -      -      -      -      -    nvidia-cuda-mps
`
	if got, want := parsePmon(pmon), map[int]int{4242: 3, 4343: 88}; !maps.Equal(got, want) {
		t.Errorf("pmon %v; want %v", got, want)
	}
	older := "# gpu        pid  type    sm   mem   enc   dec   command\n# Idx          #   C/G     %     %     %     %   name\n    0       4242     C    17     5     -     -   python3\n"
	if got, want := parsePmon(older), map[int]int{4242: 17}; !maps.Equal(got, want) {
		t.Errorf("older pmon %v; want %v", got, want)
	}
}
