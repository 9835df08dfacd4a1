"""The course's widgets: each renders data (usually a real engine trace) as HTML/SVG."""
