package sim

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

func TestPlotWritesCurves(t *testing.T) {
	s := &Summary{Policy: "fgd", Curve: []CurvePoint{{ArrivedPct: 50, AllocPct: 50}, {ArrivedPct: 100, AllocPct: 95}, {ArrivedPct: 130, AllocPct: 95.4}}}
	path := filepath.Join(t.TempDir(), "p.png")
	if err := PlotFile(path, "default", []*Summary{s}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	// The curve's colour must appear somewhere.
	want := palette[0]
	for y := 0; y < plotH; y++ {
		for x := 0; x < plotW; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			if uint8(r>>8) == want.R && uint8(g>>8) == want.G && uint8(b>>8) == want.B {
				return
			}
		}
	}
	t.Fatal("curve colour not drawn")
}
