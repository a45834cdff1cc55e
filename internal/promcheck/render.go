package promcheck

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

const (
	panelW, panelH = 520, 300
	columns        = 3
	legendLines    = 6
)

var palette = []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}}

// RenderPNG draws each panel's results as a line chart (panels in the dashboard's order,
// three a row) into a PNG at path.
func RenderPNG(path, title string, results []Result) error {
	var panels []string
	byPanel := map[string][]Result{}
	for _, r := range results {
		if _, ok := byPanel[r.Panel]; !ok {
			panels = append(panels, r.Panel)
		}
		byPanel[r.Panel] = append(byPanel[r.Panel], r)
	}
	rows := (len(panels) + columns - 1) / columns
	img := image.NewRGBA(image.Rect(0, 0, columns*panelW, 30+rows*panelH))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	label(img, 10, 20, title, color.Black)
	for i, p := range panels {
		x0, y0 := (i%columns)*panelW, 30+(i/columns)*panelH
		drawPanel(img, image.Rect(x0+5, y0+5, x0+panelW-5, y0+panelH-5), p, byPanel[p])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func drawPanel(img *image.RGBA, r image.Rectangle, title string, results []Result) {
	grey := color.RGBA{200, 200, 200, 255}
	frame(img, r, grey)
	label(img, r.Min.X+6, r.Min.Y+14, title, color.Black)
	plot := image.Rect(r.Min.X+60, r.Min.Y+24, r.Max.X-10, r.Max.Y-16-13*legendLines)
	frame(img, plot, grey)
	type line struct {
		name string
		s    Series
	}
	var lines []line
	lo, hi := math.Inf(1), math.Inf(-1)
	var tMin, tMax int64 = math.MaxInt64, math.MinInt64
	unit := ""
	for _, res := range results {
		unit = res.Unit
		if res.Err != nil {
			lines = append(lines, line{name: "ERROR " + res.Err.Error()})
			continue
		}
		for _, s := range res.Series {
			lines = append(lines, line{name: legend(res.Legend, s.Labels), s: s})
			for i, v := range s.Values {
				lo, hi = min(lo, v), max(hi, v)
				t := s.Times[i].UnixMilli()
				tMin, tMax = min(tMin, t), max(tMax, t)
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0, 1
	}
	lo = min(lo, 0)
	if hi <= lo {
		hi = lo + 1
	}
	if tMax <= tMin {
		tMax = tMin + 1
	}
	label(img, r.Min.X+4, plot.Min.Y+10, format(hi, unit), color.Black)
	label(img, r.Min.X+4, plot.Max.Y, format(lo, unit), color.Black)
	for i, l := range lines {
		c := palette[i%len(palette)]
		for j := 1; j < len(l.s.Values); j++ {
			x := func(k int) int {
				return plot.Min.X + int(float64(plot.Dx())*float64(l.s.Times[k].UnixMilli()-tMin)/float64(tMax-tMin))
			}
			y := func(k int) int { return plot.Max.Y - int(float64(plot.Dy())*(l.s.Values[k]-lo)/(hi-lo)) }
			segment(img, x(j-1), y(j-1), x(j), y(j), c)
		}
		if i < legendLines {
			name := l.name
			if len(l.s.Values) > 0 {
				name += " = " + format(l.s.Values[len(l.s.Values)-1], unit)
			}
			label(img, plot.Min.X, plot.Max.Y+14+13*i, name, c)
		}
	}
}

// legend fills a Grafana legendFormat ({{label}}) from a series' labels.
func legend(format string, labels map[string]string) string {
	if format == "" {
		return fmt.Sprint(labels)
	}
	for k, v := range labels {
		format = strings.ReplaceAll(format, "{{"+k+"}}", v)
	}
	return format
}

func format(v float64, unit string) string {
	switch unit {
	case "bytes":
		return fmt.Sprintf("%.1fGi", v/(1<<30))
	case "percent":
		return fmt.Sprintf("%.0f%%", v)
	case "percentunit":
		return fmt.Sprintf("%.0f%%", v*100)
	case "s":
		return fmt.Sprintf("%.0fs", v)
	}
	return fmt.Sprintf("%.3g", v)
}

func frame(img *image.RGBA, r image.Rectangle, c color.Color) {
	for x := r.Min.X; x < r.Max.X; x++ {
		img.Set(x, r.Min.Y, c)
		img.Set(x, r.Max.Y-1, c)
	}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		img.Set(r.Min.X, y, c)
		img.Set(r.Max.X-1, y, c)
	}
}

// segment draws a 2-pixel line by stepping along its longer axis.
func segment(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	n := max(abs(x1-x0), abs(y1-y0), 1)
	for i := 0; i <= n; i++ {
		x, y := x0+(x1-x0)*i/n, y0+(y1-y0)*i/n
		img.Set(x, y, c)
		img.Set(x+1, y, c)
		img.Set(x, y+1, c)
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func label(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
