package dev.idempotency.servlet;

import jakarta.servlet.ReadListener;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletInputStream;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;
import jakarta.servlet.http.Part;
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.net.URLDecoder;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.Enumeration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * The request as the handler gets it after the filter read its body whole (rule any-body): the same bytes again
 * from {@link #getInputStream()} and {@link #getReader()}, and the parameters and parts the container would have
 * parsed from them: the query string's and an {@code application/x-www-form-urlencoded} body's parameters, and a
 * {@code multipart/form-data} body's parts (its fields are parameters too, as in Tomcat and Jetty). The container's
 * own parsers cannot read a body that was already read, so these are parsed here, from the bytes, the same way.
 */
final class ReplayingRequest extends HttpServletRequestWrapper {
    private final byte[] body;
    private boolean streamTaken;
    private boolean readerTaken;
    private Map<String, String[]> parameters;
    private List<Part> parts;

    ReplayingRequest(HttpServletRequest request, byte[] body) {
        super(request);
        this.body = body;
    }

    @Override
    public int getContentLength() {
        return body.length;
    }

    @Override
    public long getContentLengthLong() {
        return body.length;
    }

    @Override
    public ServletInputStream getInputStream() {
        if (readerTaken) throw new IllegalStateException("getReader() was called");
        streamTaken = true;
        ByteArrayInputStream in = new ByteArrayInputStream(body);
        return new ServletInputStream() {
            @Override
            public int read() {
                return in.read();
            }

            @Override
            public int read(byte[] b, int off, int len) {
                return in.read(b, off, len);
            }

            @Override
            public boolean isFinished() {
                return in.available() == 0;
            }

            @Override
            public boolean isReady() {
                return true;
            }

            @Override
            public void setReadListener(ReadListener listener) {
                throw new UnsupportedOperationException("the idempotency filter read the body already");
            }
        };
    }

    @Override
    public BufferedReader getReader() {
        if (streamTaken) throw new IllegalStateException("getInputStream() was called");
        readerTaken = true;
        return new BufferedReader(new InputStreamReader(new ByteArrayInputStream(body), charset()));
    }

    private Charset charset() {
        String enc = getCharacterEncoding();
        try {
            return enc == null ? StandardCharsets.UTF_8 : Charset.forName(enc);
        } catch (RuntimeException e) {
            return StandardCharsets.UTF_8;
        }
    }

    private String mediaType() {
        String ct = getContentType();
        if (ct == null) return "";
        int semi = ct.indexOf(';');
        return (semi < 0 ? ct : ct.substring(0, semi)).trim().toLowerCase(Locale.ROOT);
    }

    private Map<String, String[]> parameters() {
        if (parameters != null) return parameters;
        Map<String, List<String>> p = new LinkedHashMap<>();
        String query = getQueryString();
        if (query != null) decodeForm(query, p);
        if (mediaType().equals("application/x-www-form-urlencoded")) {
            decodeForm(new String(body, StandardCharsets.ISO_8859_1), p);
        } else if (mediaType().equals("multipart/form-data")) {
            try {
                for (Part part : getParts()) {
                    if (part.getSubmittedFileName() == null) {
                        p.computeIfAbsent(part.getName(), k -> new ArrayList<>())
                                .add(new String(part.getInputStream().readAllBytes(), charset()));
                    }
                }
            } catch (IOException | ServletException | RuntimeException e) {
                // an unreadable multipart body has no parameters (getParts() says why)
            }
        }
        Map<String, String[]> out = new LinkedHashMap<>();
        p.forEach((k, v) -> out.put(k, v.toArray(new String[0])));
        parameters = Collections.unmodifiableMap(out);
        return parameters;
    }

    /** Decodes {@code a=1&b=2} (the bytes as ISO-8859-1 chars) into {@code p}, %-escapes in the request's charset. */
    private void decodeForm(String text, Map<String, List<String>> p) {
        for (String pair : text.split("&")) {
            if (pair.isEmpty()) continue;
            int eq = pair.indexOf('=');
            String k = eq < 0 ? pair : pair.substring(0, eq);
            String v = eq < 0 ? "" : pair.substring(eq + 1);
            p.computeIfAbsent(decode(k), x -> new ArrayList<>()).add(decode(v));
        }
    }

    private String decode(String latin1) {
        // back to the bytes, then URL-decoded in the request's charset (UTF-8 by default)
        String raw = new String(latin1.getBytes(StandardCharsets.ISO_8859_1), charset());
        try {
            return URLDecoder.decode(raw, charset());
        } catch (IllegalArgumentException e) {
            return raw;
        }
    }

    @Override
    public String getParameter(String name) {
        String[] v = parameters().get(name);
        return v == null || v.length == 0 ? null : v[0];
    }

    @Override
    public Map<String, String[]> getParameterMap() {
        return parameters();
    }

    @Override
    public Enumeration<String> getParameterNames() {
        return Collections.enumeration(parameters().keySet());
    }

    @Override
    public String[] getParameterValues(String name) {
        String[] v = parameters().get(name);
        return v == null ? null : v.clone();
    }

    @Override
    public Collection<Part> getParts() throws IOException, ServletException {
        if (parts != null) return parts;
        if (!mediaType().equals("multipart/form-data")) {
            throw new ServletException("the request is not multipart/form-data");
        }
        parts = Collections.unmodifiableList(Multipart.parse(getContentType(), body));
        return parts;
    }

    @Override
    public Part getPart(String name) throws IOException, ServletException {
        for (Part p : getParts()) if (p.getName().equals(name)) return p;
        return null;
    }

    /** A multipart/form-data body (RFC 7578) as in-memory parts. */
    static final class Multipart {
        private Multipart() {}

        static List<Part> parse(String contentType, byte[] body) throws ServletException {
            String boundary = null;
            for (String param : contentType.split(";")) {
                String t = param.trim();
                if (t.toLowerCase(Locale.ROOT).startsWith("boundary=")) {
                    boundary = t.substring(9).trim();
                    if (boundary.length() >= 2 && boundary.startsWith("\"") && boundary.endsWith("\"")) {
                        boundary = boundary.substring(1, boundary.length() - 1);
                    }
                }
            }
            if (boundary == null || boundary.isEmpty()) throw new ServletException("multipart without a boundary");
            byte[] dash = ("--" + boundary).getBytes(StandardCharsets.ISO_8859_1);
            byte[] delim = ("\r\n--" + boundary).getBytes(StandardCharsets.ISO_8859_1);
            List<Part> out = new ArrayList<>();
            int at = indexOf(body, dash, 0);
            if (at < 0) throw new ServletException("multipart body without its boundary");
            int pos = at + dash.length;
            while (true) {
                if (pos + 2 <= body.length && body[pos] == '-' && body[pos + 1] == '-') return out; // the close
                int eol = indexOf(body, new byte[] {'\r', '\n'}, pos);
                if (eol < 0) throw new ServletException("truncated multipart body");
                int headEnd = indexOf(body, new byte[] {'\r', '\n', '\r', '\n'}, eol);
                Map<String, String> headers = new LinkedHashMap<>();
                int contentStart;
                if (headEnd == eol) {
                    contentStart = eol + 4;
                } else {
                    if (headEnd < 0) throw new ServletException("truncated multipart headers");
                    String head = new String(body, eol + 2, headEnd - eol - 2, StandardCharsets.UTF_8);
                    for (String line : head.split("\r\n")) {
                        int colon = line.indexOf(':');
                        if (colon > 0) {
                            headers.put(line.substring(0, colon).trim().toLowerCase(Locale.ROOT),
                                    line.substring(colon + 1).trim());
                        }
                    }
                    contentStart = headEnd + 4;
                }
                int end = indexOf(body, delim, contentStart);
                if (end < 0) throw new ServletException("truncated multipart body");
                byte[] content = java.util.Arrays.copyOfRange(body, contentStart, end);
                String disposition = headers.getOrDefault("content-disposition", "");
                out.add(new MemoryPart(dispositionParam(disposition, "name"),
                        dispositionParam(disposition, "filename"), headers, content));
                pos = end + delim.length;
            }
        }

        private static String dispositionParam(String disposition, String name) {
            java.util.regex.Matcher m = java.util.regex.Pattern
                    .compile("(?i)(?:^|;)\\s*" + name + "=(?:\"((?:[^\"\\\\]|\\\\.)*)\"|([^;]*))")
                    .matcher(disposition);
            if (!m.find()) return null;
            return m.group(1) != null ? m.group(1).replaceAll("\\\\(.)", "$1") : m.group(2).trim();
        }

        static int indexOf(byte[] hay, byte[] needle, int from) {
            outer:
            for (int i = Math.max(from, 0); i + needle.length <= hay.length; i++) {
                for (int j = 0; j < needle.length; j++) if (hay[i + j] != needle[j]) continue outer;
                return i;
            }
            return -1;
        }
    }

    private record MemoryPart(String name, String fileName, Map<String, String> headers, byte[] content)
            implements Part {
        @Override
        public InputStream getInputStream() {
            return new ByteArrayInputStream(content);
        }

        @Override
        public String getContentType() {
            return headers.get("content-type");
        }

        @Override
        public String getName() {
            return name == null ? "" : name;
        }

        @Override
        public String getSubmittedFileName() {
            return fileName;
        }

        @Override
        public long getSize() {
            return content.length;
        }

        @Override
        public void write(String fileName) throws IOException {
            Files.write(Path.of(fileName), content);
        }

        @Override
        public void delete() {}

        @Override
        public String getHeader(String n) {
            return headers.get(n.toLowerCase(Locale.ROOT));
        }

        @Override
        public Collection<String> getHeaders(String n) {
            String v = getHeader(n);
            return v == null ? List.of() : List.of(v);
        }

        @Override
        public Collection<String> getHeaderNames() {
            return headers.keySet();
        }
    }
}
