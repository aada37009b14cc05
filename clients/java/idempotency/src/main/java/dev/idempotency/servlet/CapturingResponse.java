package dev.idempotency.servlet;

import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.HttpServletResponse;
import jakarta.servlet.http.HttpServletResponseWrapper;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.time.ZoneOffset;
import java.time.ZonedDateTime;
import java.time.format.DateTimeFormatter;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.function.BiFunction;

/**
 * The handler's response, held back: status, headers and body bytes stay here until the filter has completed (or
 * rolled back) the request's transaction, so the status committed is the status sent (flow rule 8). Nothing reaches
 * the client before: {@link #isCommitted()} is false until {@code sendError} or {@code sendRedirect}, and flushing
 * does nothing. {@code sendError(status, message)} is the Servlet's own HTTP error: its answer is written by the
 * filter's error page ({@link IdempotencyFilter.Builder#errorPage}), since the container's error pages run after
 * the filter, beyond the answer it stores.
 */
final class CapturingResponse extends HttpServletResponseWrapper {
    private int status = 200;
    private final List<String[]> headers = new ArrayList<>();
    private String contentType;
    private String encoding;
    private final ByteArrayOutputStream body = new ByteArrayOutputStream();
    private ServletOutputStream stream;
    private PrintWriter writer;
    private boolean committed;
    private final BiFunction<Integer, String, Answer> errorPage;
    private Answer error;

    CapturingResponse(HttpServletResponse response, BiFunction<Integer, String, Answer> errorPage) {
        super(response);
        this.errorPage = errorPage;
    }

    /** What the handler answered. */
    Answer answer() {
        if (error != null) return error;
        if (writer != null) writer.flush();
        List<String[]> out = new ArrayList<>();
        String type = getContentType();
        if (type != null) out.add(new String[] {"Content-Type", type});
        out.addAll(headers);
        return new Answer(status, out, body.toByteArray());
    }

    @Override
    public void setStatus(int sc) {
        if (!committed) status = sc;
    }

    @Override
    public int getStatus() {
        return status;
    }

    @Override
    public void sendError(int sc) throws IOException {
        sendError(sc, null);
    }

    @Override
    public void sendError(int sc, String msg) throws IOException {
        if (committed) throw new IllegalStateException("the response is committed");
        status = sc;
        error = errorPage.apply(sc, msg);
        committed = true;
    }

    @Override
    public void sendRedirect(String location) throws IOException {
        if (committed) throw new IllegalStateException("the response is committed");
        resetBuffer();
        status = 302;
        setHeader("Location", location);
        committed = true;
    }

    private static boolean framing(String name) {
        return name.equalsIgnoreCase("Content-Length") || name.equalsIgnoreCase("Transfer-Encoding");
    }

    @Override
    public void setHeader(String name, String value) {
        if (committed || name == null) return;
        if (name.equalsIgnoreCase("Content-Type")) {
            setContentType(value);
            return;
        }
        if (framing(name)) return;
        headers.removeIf(h -> h[0].equalsIgnoreCase(name));
        if (value != null) headers.add(new String[] {name, value});
    }

    @Override
    public void addHeader(String name, String value) {
        if (committed || name == null || value == null) return;
        if (name.equalsIgnoreCase("Content-Type")) {
            setContentType(value);
            return;
        }
        if (framing(name)) return;
        headers.add(new String[] {name, value});
    }

    @Override
    public void setIntHeader(String name, int value) {
        setHeader(name, Integer.toString(value));
    }

    @Override
    public void addIntHeader(String name, int value) {
        addHeader(name, Integer.toString(value));
    }

    private static String httpDate(long millis) {
        return DateTimeFormatter.RFC_1123_DATE_TIME.format(
                ZonedDateTime.ofInstant(Instant.ofEpochMilli(millis), ZoneOffset.UTC));
    }

    @Override
    public void setDateHeader(String name, long date) {
        setHeader(name, httpDate(date));
    }

    @Override
    public void addDateHeader(String name, long date) {
        addHeader(name, httpDate(date));
    }

    @Override
    public boolean containsHeader(String name) {
        if (name.equalsIgnoreCase("Content-Type")) return contentType != null;
        return headers.stream().anyMatch(h -> h[0].equalsIgnoreCase(name));
    }

    @Override
    public String getHeader(String name) {
        if (name.equalsIgnoreCase("Content-Type")) return getContentType();
        for (String[] h : headers) if (h[0].equalsIgnoreCase(name)) return h[1];
        return null;
    }

    @Override
    public Collection<String> getHeaders(String name) {
        List<String> out = new ArrayList<>();
        for (String[] h : headers) if (h[0].equalsIgnoreCase(name)) out.add(h[1]);
        return out;
    }

    @Override
    public Collection<String> getHeaderNames() {
        LinkedHashSet<String> out = new LinkedHashSet<>();
        if (contentType != null) out.add("Content-Type");
        for (String[] h : headers) out.add(h[0]);
        return out;
    }

    @Override
    public void setContentType(String type) {
        if (committed) return;
        contentType = type;
        if (type != null) {
            int at = type.toLowerCase(Locale.ROOT).indexOf("charset=");
            if (at >= 0) encoding = type.substring(at + 8).trim().replace("\"", "");
        }
    }

    @Override
    public String getContentType() {
        if (contentType == null) return null;
        if (writer != null && !contentType.toLowerCase(Locale.ROOT).contains("charset=")) {
            return contentType + ";charset=" + getCharacterEncoding();
        }
        return contentType;
    }

    @Override
    public void setCharacterEncoding(String charset) {
        if (writer == null && !committed) encoding = charset;
    }

    @Override
    public String getCharacterEncoding() {
        return encoding == null ? "ISO-8859-1" : encoding;
    }

    @Override
    public void setContentLength(int len) {}

    @Override
    public void setContentLengthLong(long len) {}

    @Override
    public ServletOutputStream getOutputStream() {
        if (writer != null) throw new IllegalStateException("getWriter() was called");
        if (stream == null) {
            stream = new ServletOutputStream() {
                @Override
                public void write(int b) {
                    if (!committed) body.write(b);
                }

                @Override
                public void write(byte[] b, int off, int len) {
                    if (!committed) body.write(b, off, len);
                }

                @Override
                public boolean isReady() {
                    return true;
                }

                @Override
                public void setWriteListener(WriteListener listener) {
                    throw new UnsupportedOperationException("the idempotency filter holds the response back");
                }
            };
        }
        return stream;
    }

    @Override
    public PrintWriter getWriter() {
        if (stream != null) throw new IllegalStateException("getOutputStream() was called");
        if (writer == null) {
            Charset cs;
            try {
                cs = Charset.forName(getCharacterEncoding());
            } catch (RuntimeException e) {
                cs = StandardCharsets.ISO_8859_1;
            }
            writer = new PrintWriter(new OutputStreamWriter(body, cs));
        }
        return writer;
    }

    @Override
    public void flushBuffer() {
        if (writer != null) writer.flush();
    }

    @Override
    public boolean isCommitted() {
        return committed;
    }

    @Override
    public void reset() {
        if (committed) throw new IllegalStateException("the response is committed");
        status = 200;
        headers.clear();
        contentType = null;
        resetBuffer();
    }

    @Override
    public void resetBuffer() {
        if (committed) throw new IllegalStateException("the response is committed");
        if (writer != null) writer.flush();
        body.reset();
    }

    @Override
    public void setBufferSize(int size) {}

    @Override
    public int getBufferSize() {
        return Integer.MAX_VALUE;
    }
}
