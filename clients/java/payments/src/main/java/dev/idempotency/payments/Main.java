package dev.idempotency.payments;

import dev.idempotency.servlet.IdempotencyFilter;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.Path;
import org.apache.catalina.Context;
import org.apache.catalina.connector.Connector;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.jdbc.pool.DataSource;
import org.apache.tomcat.jdbc.pool.PoolProperties;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;

/**
 * Starts the payment service on embedded Tomcat 10.1: PORT (127.0.0.1:$PORT), DATABASE_URL (a libpq URI,
 * {@code postgresql://user@host:port/db}), PAYMENTS_FAULTS=1 (the X-Fault header), RIDES_LEASE_SECONDS (30),
 * PG_POOL_MAX (10), PG_PREPARED=0 (never name a statement).
 */
public final class Main {
    private Main() {}

    /** The JDBC URL of a libpq URI ({@code postgresql://user:password@host:port/db?...}). */
    static String jdbcUrl(String libpq) {
        URI u = URI.create(libpq);
        StringBuilder b = new StringBuilder("jdbc:postgresql://").append(u.getHost());
        if (u.getPort() > 0) b.append(':').append(u.getPort());
        b.append(u.getRawPath() == null || u.getRawPath().isEmpty() ? "/" : u.getRawPath());
        String sep = "?";
        if (u.getRawUserInfo() != null) {
            String[] up = u.getRawUserInfo().split(":", 2);
            b.append(sep).append("user=").append(up[0]);
            sep = "&";
            if (up.length > 1) b.append(sep).append("password=").append(up[1]);
        }
        if (u.getRawQuery() != null) {
            b.append(sep).append(u.getRawQuery());
            sep = "&";
        }
        // No session SET: pgjdbc sends "SET extra_float_digits = 3" after connecting unless told the server is 9.0+
        // (then it goes in the startup packet), and through PgBouncer in transaction pooling a SET outlives the
        // client's transaction on a server connection others use (CONTRACT.md Process, session-settings)
        b.append(sep).append("assumeMinServerVersion=9.0");
        return b.toString();
    }

    public static void main(String[] args) throws Exception {
        String url = System.getenv("DATABASE_URL");
        if (url == null || url.isEmpty()) {
            System.err.println("payments: DATABASE_URL is not set (e.g. postgresql://postgres@127.0.0.1:5432/payments)");
            System.exit(2);
        }
        int port = Integer.parseInt(System.getenv().getOrDefault("PORT", "8080"));
        boolean faults = "1".equals(System.getenv("PAYMENTS_FAULTS"));
        int lease = Integer.parseInt(System.getenv().getOrDefault("RIDES_LEASE_SECONDS", "30"));
        int max = Integer.parseInt(System.getenv().getOrDefault("PG_POOL_MAX", "10"));

        // tomcat-jdbc's pool: up to PG_POOL_MAX connections, all kept while idle (no idle timeout: rule idle-409)
        // Behind a pooler in transaction pooling (PgBouncer before 1.21) no statement may be named: pgjdbc's
        // prepareThreshold=0 (the filter finds it by itself too; the service's own statements need it here)
        String jdbc = jdbcUrl(url);
        try (java.sql.Connection probe = java.sql.DriverManager.getConnection(jdbc)) {
            if (IdempotencyFilter.behindPooler(probe)) {
                jdbc += (jdbc.contains("?") ? "&" : "?") + "prepareThreshold=0";
                System.out.println("payments: behind a pooler: prepareThreshold=0");
            }
        }
        PoolProperties p = new PoolProperties();
        p.setDriverClassName("org.postgresql.Driver");
        p.setUrl(jdbc);
        p.setMaxActive(max);
        p.setMaxIdle(max);
        p.setMinIdle(Math.min(2, max));
        p.setInitialSize(0);
        p.setMaxWait(30000);
        p.setMinEvictableIdleTimeMillis(Integer.MAX_VALUE);
        p.setTestOnBorrow(false);
        p.setDefaultAutoCommit(true);
        p.setRollbackOnReturn(true);
        DataSource pool = new DataSource(p);

        IdempotencyFilter.Prepared prepared = "0".equals(System.getenv("PG_PREPARED"))
                ? IdempotencyFilter.Prepared.NEVER : IdempotencyFilter.Prepared.AUTO;
        IdempotencyFilter filter = IdempotencyFilter.builder(pool)
                .scope(Payments::authenticate)
                .replayHeaders("Content-Type", "Location")
                .methods("POST")
                .prepared(prepared)
                .build();

        Path base = Files.createTempDirectory("payments-tomcat");
        base.toFile().deleteOnExit();
        Tomcat tomcat = new Tomcat();
        tomcat.setBaseDir(base.toString());
        Connector connector = new Connector("HTTP/1.1");
        connector.setPort(port);
        connector.setProperty("address", System.getenv().getOrDefault("HOST", "127.0.0.1"));
        // rule raw-target: /files/a%2Fb reaches the application as sent (Tomcat refuses %2F by default)
        connector.setEncodedSolidusHandling("passthrough");
        connector.setProperty("maxThreads", "32");
        tomcat.getService().addConnector(connector);
        tomcat.setConnector(connector);

        Context ctx = tomcat.addContext("", null);
        Tomcat.addServlet(ctx, "payments", new Payments(pool, faults, new Rides(pool, faults, lease)));
        ctx.addServletMappingDecoded("/", "payments");
        FilterDef def = new FilterDef();
        def.setFilterName("idempotency");
        def.setFilter(filter);
        ctx.addFilterDef(def);
        FilterMap map = new FilterMap();
        map.setFilterName("idempotency");
        map.addURLPatternDecoded("/payments");
        map.addURLPatternDecoded("/files/*");
        map.addURLPatternDecoded("/documents");
        ctx.addFilterMap(map);

        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                tomcat.stop();
                tomcat.destroy();
            } catch (Exception e) {
                // stopping anyway
            }
            pool.close();
        }));
        tomcat.start();
        System.out.println("payments: listening on http://127.0.0.1:" + port + (faults ? " (X-Fault enabled)" : ""));
        tomcat.getServer().await();
    }
}
